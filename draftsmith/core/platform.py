"""What a job does differently on a CUDA GPU, decided in one place from the device's name.

This project's machines have no GPU, so a branch taken only where the device is CUDA is code no test
enters unless the decision is a function of the device that a test can call with ``"cuda"`` on a CPU
(as vLLM's ``platforms/`` answers capability questions in one place). Each function here is such a
decision; only executing it (a Triton kernel, a pinned copy, a compiled graph) needs the GPU, and
docs/gpus-and-clusters.md names the GPU-check step that executes each one.

``device`` is what :func:`draftsmith.core.compute.device` returns: ``"cuda"`` (or ``"cuda:N"``), or
``"cpu"``.
"""

from __future__ import annotations

# speculators' draft attention (its --draft-attn-impl): FlexAttention with a block mask is what it
# trains with on GPUs, and is fast only compiled; sdpa takes a dense mask.
FLEX_ATTENTION = "simple_flex_attention"
SDPA = "sdpa"


def is_cuda(device: str) -> bool:
    return device.split(":")[0] == "cuda"


def probes_trainer(device: str) -> bool:
    """Whether ``train.loss_implementation: auto`` and ``train.compile: auto`` are probed on ``device``.
    speculators compiles only on CUDA and its fused losses are Triton GPU kernels: elsewhere both are
    eager, with nothing to probe."""
    return is_cuda(device)


def draft_attention(device: str, compiled: bool) -> str:
    """speculators' draft attention on ``device``. FlexAttention only where it is compiled: uncompiled it
    falls back to materialising every score (at total_seq_len 8,192 with 3 test-time steps, 8,192 x
    24,576 scores x 32 heads in fp32, ~26 GB before the backward), and on a CPU it has no backward.
    Everywhere else sdpa, whose dense mask is one [seq, seq x steps] bf16 tensor shared by the heads."""
    return FLEX_ATTENTION if is_cuda(device) and compiled else SDPA


def pinned_staging(device: str) -> bool:
    """Whether rows computed on ``device`` go to the shard writer through page-locked host memory, copied
    without waiting (the writer waits on an event): on a CUDA GPU. A CPU's tensors are already on the host."""
    return is_cuda(device)


def staging_event_options(device: str) -> dict:
    """How the event after a row's pinned copies is made: on CUDA a blocking one, so the shard writer's
    thread sleeps until the copy is done instead of spinning a host core on every row."""
    return {"blocking": True} if is_cuda(device) else {}


def baseline_once_per_grid(device: str) -> bool:
    """Whether the target alone is measured once for the whole serving grid (every method's speed-ups divide
    by it) rather than again in each method's window. On CUDA GPUs measurements run one at a time on devices
    of their own, so a second baseline measures the same number again, at a server start each (most of an
    hour for a 1T target). A CPU is shared with whatever else the machine runs: each method measures the
    target alone in its own window, and windows that disagree are flagged (:mod:`draftsmith.evaluation.decide.pick`)."""
    return is_cuda(device)


def ranking_figure(pick_by: str, device: str) -> str:
    """The figure the serving recipe ranks settings by, plain serving among them: ``pick_by`` where the
    measurement ran on an accelerator. On a CPU drafting costs about as much as a target step, so speed-ups
    there say nothing of a GPU's and plain serving would win everywhere: the figure that carries over is
    tokens per target step (``tau``)."""
    return pick_by if is_cuda(device) else "tau"


def gpu_stack_problem(torch_gpu_build: str | None, server_gpus: int, train_gpus: int) -> str | None:
    """Why GPU jobs cannot run in this Python, or None: ``server.gpus`` or ``train.gpus`` ask for GPUs and its
    torch was built without CUDA (``torch_gpu_build`` is ``torch.version.cuda``, or ``torch.version.hip``: None on
    the CPU stack, ``.venv``). Asked of the build, not of a GPU: a CUDA torch imports on a SLURM login node without
    GPUs, which runs the jobs' stack (``.venv-gpu``) as they do."""
    if torch_gpu_build or not (server_gpus or train_gpus):
        return None
    asked = " and ".join(f"{key} is {count}" for key, count in (("server.gpus", server_gpus),
                                                                 ("train.gpus", train_gpus)) if count)
    return (f"{asked}, and this Python's torch has no CUDA (the CPU stack): set up and run the GPU stack with "
            "`DRAFTSMITH_STACK=gpu ./run.sh ...` (where nvidia-smi lists a GPU, ./run.sh picks it by itself)")


def cpu_ranking_text() -> str:
    """:func:`ranking_figure`'s CPU rule in one sentence (the card's note under what to serve)."""
    return ("Measured on a CPU, where a draft costs about a target step, so settings are ranked by tokens per "
            "target step and the speed-ups say nothing of a GPU's.")


def cpu_draft_length_text() -> str:
    """What a CPU's ranking by tokens per target step says of the draft length, in one sentence."""
    return ("On a CPU tokens per step rise with the draft length but for the runs' noise, so a draft length "
            "measured there is not a GPU's best.")
