"""Every change draftsmith makes to speculators' trainer, in one place, each saying what it changes and why.

speculators 0.9.0 is a library draftsmith drives, not forks; where its trainer cannot do what a run
needs, a function here replaces one of its attributes before ``cli.main`` runs (in the trainer's
process only). A replaced attribute that a new release renamed would be skipped without an error
and train differently, so importing this module checks the installed release first
(:data:`SPECULATORS_VERSIONS`).

| patch | what it changes | why |
|---|---|---|
| :func:`adapt_for_cpu` | device, autocast, step timer, checkpoint map, distributed set-up | the trainer assumes CUDA |
| :func:`train_lm_head` | draft LM head trainable before the DDP wrap | SpecForge and EAGLE train it |
| :func:`weights_in_fp32`, :func:`muon_in_fp32` | fp32 weights and Muon steps | bf16 emulated on some CPUs |
| :func:`track_interruption` | notes epoch and step of a graceful stop | a mid-epoch checkpoint to resume |
| :func:`stop_together_after_a_step` | ranks stop after the same step | a stop mid-all-reduce hangs |
| :func:`keep_workers_through_sigterm` | dataloader workers ignore SIGTERM | SLURM signals every process |
| :func:`metrics_to` | a handler on ``speculators.metrics`` after its set-up | per-epoch validation on disk |
| :func:`time_phases` | notes when the model is built, the first step and validation end | time to first step |
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

# The speculators releases this module's patches of its trainer were written against (read from their
# source). In another release a patch may miss what it patches, and a missed patch does not fail: it
# trains differently (a head left frozen, ranks that stop apart).
SPECULATORS_VERSIONS = ("0.9.0",)


class SpeculatorsVersionError(ValueError):
    pass


def check_speculators() -> None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("speculators")
    except PackageNotFoundError:
        raise SpeculatorsVersionError("speculators is not installed (envs/requirements-*.txt pin it)") from None
    if found not in SPECULATORS_VERSIONS:
        raise SpeculatorsVersionError(
            f"speculators {found} is installed, and draftsmith's patches of its trainer "
            f"(draftsmith/training/speculators_patches.py) were "
            f"written for {', '.join(SPECULATORS_VERSIONS)}: install that (envs/requirements-*.txt pin it), or check "
            f"the patches against {found} and add it to SPECULATORS_VERSIONS")


def adapt_for_cpu() -> bool:
    """Patch speculators' trainer for a machine without an accelerator; return whether it did."""
    import torch

    if torch.accelerator.is_available():
        return False
    from speculators.train import checkpointer, cli, trainer

    original_init = trainer.Trainer.__init__

    def init_on_cpu(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self.device_type = "cpu"  # autocast target; speculators falls back to "cuda"

    trainer.get_local_rank = lambda: "cpu"  # __init__ moves the model to this before returning
    trainer.Trainer.__init__ = init_on_cpu
    trainer.torch.accelerator.synchronize = lambda *a, **k: None  # nothing to wait for on the CPU
    checkpointer.get_current_device = lambda: "cpu"
    cli.maybe_setup_distributed = _setup_distributed_on_cpu
    return True


def _setup_distributed_on_cpu(sp_size: int = 1) -> None:
    """speculators' ``maybe_setup_distributed`` for CPU processes under torchrun: the gloo backend,
    no device to bind. It fills the same module state, so the trainer runs its DDP path unchanged."""
    import torch.distributed as dist
    from speculators.train import distributed

    if "LOCAL_RANK" not in os.environ:
        return distributed.maybe_setup_distributed(sp_size)
    dist.init_process_group("gloo")
    distributed._local_rank, distributed._is_distributed = int(os.environ["LOCAL_RANK"]), True
    distributed._rank, distributed._world_size = dist.get_rank(), dist.get_world_size()
    distributed._init_sp_process_groups(distributed._rank, distributed._world_size, sp_size)
    return None


_TORCH_WORKER_LOOP = None  # torch's own loop, once replaced (set in the trainer's process)


def _worker_loop_ignoring_sigterm(*args, **kwargs):
    """A dataloader worker that outlives a SIGTERM sent to the whole job (SLURM's scancel and time
    limits signal every process): the trainer needs its workers until the interrupt checkpoint is
    saved, and shuts them down itself afterwards."""
    import signal

    from torch.utils.data._utils import signal_handling, worker

    set_handlers = signal_handling._set_worker_signal_handlers  # torch's loop installs its own SIGTERM handler

    def set_handlers_but_ignore_sigterm() -> None:
        set_handlers()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    signal_handling._set_worker_signal_handlers = set_handlers_but_ignore_sigterm
    return (_TORCH_WORKER_LOOP or worker._worker_loop)(*args, **kwargs)


def keep_workers_through_sigterm() -> None:
    """Spawned workers run the loop this attribute names (imported there by qualified name)."""
    global _TORCH_WORKER_LOOP
    from torch.utils.data._utils import worker

    if worker._worker_loop is not _worker_loop_ignoring_sigterm:
        _TORCH_WORKER_LOOP = worker._worker_loop
        worker._worker_loop = _worker_loop_ignoring_sigterm


def track_interruption(trainer_cls, state: dict) -> None:
    """Record where a graceful stop happened (epoch, step within it), from which ``train._resumable``
    makes a mid-epoch checkpoint that speculators resumes from."""
    original_epoch, original_save = trainer_cls.train_epoch, trainer_cls.maybe_save_checkpoint

    def train_epoch(self, epoch, *args, **kwargs):
        skip = getattr(self, "_resume_local_step", 0) if epoch == getattr(self, "current_epoch", epoch) else 0
        state["epoch"], state["epoch_start_step"] = epoch, self.global_step - skip
        return original_epoch(self, epoch, *args, **kwargs)

    def maybe_save_checkpoint(self, epoch, local_step: int = 0):
        if epoch == "interrupted":
            state["interrupted"] = True
            state["global_step"] = self.global_step
            # SLURM (scancel, a time limit) signals every process of the job: the dataloader
            # workers die too, and torch's SIGCHLD check would abort the save that follows.
            from torch.utils.data._utils import signal_handling

            signal_handling._error_if_any_worker_fails = lambda: None
        return original_save(self, epoch, local_step)

    trainer_cls.train_epoch, trainer_cls.maybe_save_checkpoint = train_epoch, maybe_save_checkpoint


def stop_together_after_a_step(trainer_cls) -> None:
    """Under torchrun a stop signal reaches the ranks at different points of a step, and speculators
    raises where it lands: one rank then enters the checkpoint's collectives while another still
    waits in the step's gradient all-reduce, both hang until torchrun kills them, and nothing is
    saved. Here the signal only sets a flag; after every optimizer step the ranks all-reduce it and
    all raise speculators' interrupt at the same step, so the save that follows matches up."""
    import signal

    import torch
    import torch.distributed as dist
    from speculators.train import graceful_shutdown

    signalled: list[str] = []

    def note_signal(handler, signum, frame) -> None:
        if os.getpid() == handler._owner_pid and not signalled:  # not in forked dataloader workers
            signalled.append(signal.Signals(signum).name)
            log.warning("%s received: stopping after this optimizer step, with the other ranks",
                        signalled[0])

    graceful_shutdown.GracefulShutdownHandler._handler = note_signal
    original_epoch = trainer_cls.train_epoch

    def train_epoch(self, epoch, *args, step_callback=None, **kwargs):
        device = next(self.model.parameters()).device

        def stop_if_any_rank_was_signalled() -> None:
            if step_callback is not None:
                step_callback()
            flag = torch.tensor([float(bool(signalled))], device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item():
                raise graceful_shutdown.TrainingInterruptedError(signalled[0] if signalled else "another rank")

        return original_epoch(self, epoch, *args, step_callback=stop_if_any_rank_was_signalled, **kwargs)

    trainer_cls.train_epoch = train_epoch


def newton_schulz_fp32(grad, ns_coefficients: tuple[float, float, float], ns_steps: int, eps: float):
    """torch's Muon orthogonalisation (``torch.optim._muon._zeropower_via_newtonschulz``) in fp32: the
    original casts to bf16, which a CPU without native bf16 emulates: 25 s of a 36 s step here."""
    import torch

    a, b, c = ns_coefficients
    ortho = grad.float()
    if grad.size(0) > grad.size(1):
        ortho = ortho.T
    ortho = ortho / ortho.norm().clamp(min=eps)
    for _ in range(ns_steps):
        gram = ortho @ ortho.T
        ortho = torch.addmm(ortho, torch.addmm(gram, gram, gram, beta=b, alpha=c), ortho, beta=a)
    return ortho.T if grad.size(0) > grad.size(1) else ortho


def muon_in_fp32() -> None:
    from torch.optim import _muon

    _muon._zeropower_via_newtonschulz = newton_schulz_fp32


def train_lm_head(trainer_cls) -> None:
    """Make the draft LM head trainable: speculators copies the target's and freezes it (SpecForge and
    EAGLE train it). Set before ``setup_model`` wraps the model: DDP and FSDP decide at the wrap which
    parameters they synchronise, so a head made trainable afterwards trains apart on every rank."""
    original = trainer_cls.setup_model

    def setup_model(self, *args, **kwargs):
        self.model.lm_head.weight.requires_grad_(True)
        return original(self, *args, **kwargs)

    trainer_cls.setup_model = setup_model


def weights_in_fp32(trainer_cls) -> None:
    """A warm-started drafter arrives in its checkpoint's bf16; computing in fp32 (no autocast on a CPU
    without native bf16) needs fp32 weights, as a drafter trained from scratch already has."""
    original = trainer_cls.setup_model

    def setup_model(self, *args, **kwargs):
        self.model.float()
        return original(self, *args, **kwargs)

    trainer_cls.setup_model = setup_model


def stop_dataloader_workers() -> None:
    """After a failed step the trainer's dataloader workers are still up, and they ignore SIGTERM
    (:func:`keep_workers_through_sigterm`): multiprocessing's exit handler would wait for them
    forever. The job is failing anyway; end them."""
    import multiprocessing

    for child in multiprocessing.active_children():
        child.kill()


@contextmanager
def metrics_to(handler: logging.Handler) -> Iterator[None]:
    """speculators configures its loggers with ``dictConfig`` inside ``cli.main``, which replaces any
    handler attached beforehand: attach ``handler`` right after its set-up (rank 0 only under torchrun)."""
    from speculators.train import cli

    setup_metric_logger = cli.setup_metric_logger

    def setup_then_collect(*args, **kwargs):
        setup_metric_logger(*args, **kwargs)
        if int(os.environ.get("RANK", "0")) == 0:
            logging.getLogger("speculators.metrics").addHandler(handler)

    cli.setup_metric_logger = setup_then_collect
    try:
        yield
    finally:
        cli.setup_metric_logger = setup_metric_logger
        logging.getLogger("speculators.metrics").removeHandler(handler)


def time_phases(trainer_cls, phases) -> None:
    """Tell ``phases`` (:class:`draftsmith.training.train.Phases`) when the trainer is built, how many steps
    the run takes (speculators' own count: ``max_steps``, else epochs x its loader's batches) and how many
    came before each epoch's, when each step and each validation ends: the one-time costs (compilation in the
    first step and the first validation) show apart from the steady pace."""
    original_init, original_epoch, original_val = trainer_cls.__init__, trainer_cls.train_epoch, \
        trainer_cls.val_epoch

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        phases.mark("build")

    def train_epoch(self, epoch, *args, step_callback=None, **kwargs):
        def count_then_call() -> None:
            phases.step()
            if step_callback is not None:
                step_callback()

        # speculators' own count of the steps before this epoch's (restored on a resume, mid-epoch too)
        phases.plan(self.config.max_steps or self.config.num_epochs * len(self.train_loader), self.global_step)
        phases.enter("training")
        return original_epoch(self, epoch, *args, step_callback=count_then_call, **kwargs)

    def val_epoch(self, epoch, *args, **kwargs):
        phases.enter("validation")
        result = original_val(self, epoch, *args, **kwargs)
        phases.validated()
        return result

    trainer_cls.__init__, trainer_cls.train_epoch, trainer_cls.val_epoch = init, train_epoch, val_epoch


check_speculators()
