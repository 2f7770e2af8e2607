"""Which floating-point type to compute in, decided on the machine that runs the job.

bf16 is what recent GPUs (compute capability 8.0 on: A100, H100) and CPUs (AVX-512 with bf16, AMX)
compute natively; older GPUs (V100, T4) compute fp16, which ``auto`` then chooses. On a CPU without it
torch emulates bf16: a 1024² matmul ran at 0.9 GFLOP/s against 64 in fp32 on an AVX2-only EPYC,
and vLLM, hidden-state extraction and training all slowed by the same factor. AVX-512 alone is not
enough: on a Xeon without avx512_bf16 or AMX the same matmul ran at 23 GFLOP/s against 59-80.
``auto`` therefore computes in bf16 where it is native and in fp32 elsewhere. Hidden states are
stored in bf16 either way (:mod:`draftsmith.hidden_states.store`), and drafter checkpoints are saved
in bf16 by speculators.

The choice is operational: it never enters a rule's params, a run key or a fingerprint, so moving
a run between machines reruns nothing. Where it was made, it is recorded (manifest, training
summary, evaluation results, report).

``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2`` makes a faster CPU report and behave like an
AVX2-only one, which is how the slow path is exercised on any machine.
"""

from __future__ import annotations

from dataclasses import dataclass

DTYPES = ("auto", "bfloat16", "float32", "float16")


@dataclass(frozen=True)
class Choice:
    dtype: str
    reason: str

    def as_dict(self) -> dict:
        return {"dtype": self.dtype, "reason": self.reason}


def has_accelerator() -> bool:
    import torch

    return torch.accelerator.is_available()


def device() -> str:
    """Where a job's own torch computation runs: the accelerator (``cuda``; the job's GPUs are
    those ``CUDA_VISIBLE_DEVICES`` names) or the CPU."""
    import torch

    return str(torch.accelerator.current_accelerator()) if has_accelerator() else "cpu"


def accelerators() -> list[str]:
    """The name of each accelerator the job sees (none on a CPU): what a measurement's figures depend on."""
    import torch

    if not has_accelerator():
        return []
    kind = torch.accelerator.current_accelerator().type
    name = getattr(getattr(torch, kind, None), "get_device_name", lambda i: kind)  # MPS names none
    return [name(i) for i in range(torch.accelerator.device_count())]


def bf16_native() -> tuple[bool, str]:
    """Whether this machine computes bf16 natively, and why we think so."""
    import torch

    if has_accelerator():
        accelerator = torch.accelerator.current_accelerator()
        if accelerator.type == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
            major, minor = torch.cuda.get_device_capability()
            return False, f"GPU compute capability {major}.{minor} (no bf16 before 8.0: V100, T4)"
        return True, f"accelerator {accelerator}"
    capability = torch.backends.cpu.get_cpu_capability()
    if not capability.startswith("AVX512"):
        return False, f"CPU capability {capability}, bf16 emulated"
    # oneDNN "supports" bf16 on any AVX-512 CPU, by conversion: only these instructions compute it.
    if not (torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()):
        return False, f"CPU capability {capability} without avx512_bf16 or AMX, bf16 emulated"
    return True, f"CPU capability {capability}"


def choose(setting: str = "auto", training: bool = False) -> Choice:
    """The dtype for ``setting`` (``auto`` or an explicit dtype) on this machine. ``training``: for
    speculators' trainer, which autocasts without gradient scaling and so cannot take fp16."""
    if setting not in DTYPES:
        raise ValueError(f"unknown compute dtype {setting!r}; use one of {', '.join(DTYPES)}")
    if setting == "float16" and training:
        raise ValueError("speculators trains in bfloat16 or float32, not float16 (it has no gradient scaling)")
    if setting != "auto":
        return Choice(setting, "set in the config")
    native, why = bf16_native()
    if native:
        return Choice("bfloat16", why)
    # A GPU without bf16 serves in fp16 (vLLM refuses bf16 there) and trains in fp32; a CPU, fp32.
    return Choice("float16" if has_accelerator() and not training else "float32", why)
