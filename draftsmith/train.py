"""Train an EAGLE-3 drafter with speculators, on GPU as published or on CPU through a small adaptation.

- **CPU.** speculators' trainer assumes an accelerator in three places: it moves the model and
  batches to ``get_local_rank()`` (int 0, i.e. ``cuda:0``), autocasts with device type ``cuda``
  when no accelerator is found, and synchronises ``torch.accelerator`` in its step timer; its
  checkpointer also maps resumed state to ``cuda:0``. :func:`adapt_for_cpu` redirects exactly
  those to the CPU when no accelerator exists and changes nothing on a GPU machine.
- **Resume.** A checkpoint is saved every epoch; a rerun of the same run key resumes from the last
  one. A graceful stop (SIGTERM from Snakemake or a cluster time limit) makes speculators save an
  ``interrupted`` checkpoint; :func:`train` turns it into a mid-epoch checkpoint that speculators
  resumes from, and the job fails saying so. Under torchrun the ranks stop together after the
  same optimizer step (:func:`_stop_together_after_a_step`).
- **Checkpoint choice.** Every epoch is validated; the exported epoch is the one with the best
  simulated acceptance length (:func:`simulated_tau`), not the last: τ can peak while the loss
  still falls.
- **Several GPUs** run the same worker under ``torchrun`` (:func:`torchrun_command`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

from draftsmith.atomic import atomic_path

log = logging.getLogger(__name__)

# The original EAGLE-3 decoder layer (what SGLang's LlamaForCausalLMEagle3 computes) versus
# speculators' variant with extra norms (vLLM only).
NO_NORM_BEFORE_FC = "--no-norm-before-fc"
ARCHITECTURE_FLAGS = {
    "eagle3": ["--no-norm-before-residual", NO_NORM_BEFORE_FC, "--no-norm-output"],
    "speculators": [],
}


class TrainingInterrupted(RuntimeError):
    pass


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
            f"speculators {found} is installed, and draftsmith's patches of its trainer (draftsmith/train.py) were "
            f"written for {', '.join(SPECULATORS_VERSIONS)}: install that (envs/requirements-*.txt pin it), or check "
            f"the patches against {found} and add it to SPECULATORS_VERSIONS")


def adapt_for_cpu() -> bool:
    """Patch speculators' trainer for a machine without an accelerator; return whether it did."""
    import torch

    check_speculators()
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


def write_dataset(merged: Path, dest: Path, keep: list[int]) -> None:
    """The arrow dataset speculators reads (``input_ids``, ``loss_mask``, ``seq_len``): the merged rows
    at positions ``keep``, in merged order (rows without hidden states are left out)."""
    import pyarrow as pa
    from datasets import Dataset

    table = pq.read_table(merged, columns=["input_ids", "loss_mask", "seq_len"]).take(pa.array(keep, pa.int64()))
    with atomic_path(dest) as tmp:
        ds = Dataset.from_dict({name: table.column(name).to_pylist() for name in table.column_names})
        ds.set_format(type="torch")
        ds.save_to_disk(str(tmp))


def speculators_args(cfg: dict, *, verifier: str, data_dir: Path, save_dir: Path, d2t: Path, t2d: Path,
                     aux_layers: list[int], train_ratio: float, on_cpu: bool, log_dir: Path, num_workers: int,
                     from_pretrained: Path | None = None, hidden_states_backend: str = "file",
                     vllm_endpoint: str | None = None, dtype: str = "bfloat16",
                     trust_remote_code: bool = False) -> list[str]:
    args: dict = {
        "hidden-states-dtype": dtype,
        "speculator-type": "eagle3",
        "verifier-name-or-path": verifier,
        "data-path": str(data_dir),
        "save-path": str(save_dir),
        "d2t-path": str(d2t),
        "t2d-path": str(t2d),
        "target-layer-ids": aux_layers,
        "train-data-ratio": train_ratio,
        "epochs": cfg["epochs"],
        "lr": cfg["lr"],
        "optimizer": cfg["optimizer"],
        "weight-decay": cfg["weight_decay"],
        "scheduler-type": cfg["scheduler"],
        "total-seq-len": cfg["total_seq_len"],
        "ttt-steps": cfg["ttt_steps"],
        "ttt-step-loss-decay": cfg["ttt_step_loss_decay"],
        "loss-fn": cfg["loss_fn"],
        "seed": cfg["seed"],
        "num-workers": num_workers,
        "checkpoint-freq": 1,
        "log-dir": str(log_dir),
        "hidden-states-backend": hidden_states_backend,
    }
    for key, flag in (("max_steps", "max-steps"), ("warmup_steps", "scheduler-warmup-steps"),
                      ("warmup_ratio", "scheduler-warmup-ratio")):
        if cfg.get(key) is not None:
            args[flag] = cfg[key]
    if from_pretrained:  # the checkpoint defines the draft model: its layers and architecture
        args["from-pretrained"] = str(from_pretrained)
    else:
        args["num-layers"] = cfg["num_layers"]
        args["draft-arch"] = cfg["draft_arch"]
    if vllm_endpoint:
        args.update({"vllm-endpoint": vllm_endpoint, "on-missing": "generate"})
    else:
        args["on-missing"] = "raise"  # offline: a missing hidden state is a bug, never a silent skip
    if on_cpu:
        # The fused loss is a Triton kernel and FlexAttention has no CPU backward.
        args["loss-implementation"] = "eager"
        args["draft-attn-impl"] = "sdpa"
    argv = []
    for key, value in args.items():
        argv += [f"--{key}", *map(str, value)] if isinstance(value, list) else [f"--{key}", str(value)]
    model_flags = [] if from_pretrained else list(ARCHITECTURE_FLAGS[cfg["architecture"]])
    if cfg["fc_norm"] and not from_pretrained:
        # EAGLE-3.1's per-layer norm replaces the one norm before fc (speculators refuses both)
        model_flags += ["--fc-norm"] + ([] if NO_NORM_BEFORE_FC in model_flags else [NO_NORM_BEFORE_FC])
    return argv + model_flags + ([TRAIN_LM_HEAD] if cfg["train_lm_head"] else []) + \
        (["--trust-remote-code"] if trust_remote_code else [])


# How long torchrun waits for its ranks after passing on a stop signal before it kills them (its own
# default, 30 s, can cut the interrupt checkpoint short): a step to finish plus speculators' save,
# which gives up after 120 s.
RANKS_STOP_TIMEOUT_S = 180


def torchrun_command(nproc: int, metrics_file: Path, argv: list[str]) -> list[str]:
    """Several training processes (one per GPU; gloo ranks on a CPU): the same worker as a
    single-process run, under torchrun."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            f"--shutdown-timeout={RANKS_STOP_TIMEOUT_S}", "-m", "draftsmith.train", str(metrics_file), *argv]


def interrupted_marker(metrics_file: Path) -> Path:
    """Where rank 0 of a torchrun says it was interrupted, and where its checkpoint is."""
    return metrics_file.with_name("interrupted.txt")


def train_under_torchrun(nproc: int, metrics_file: Path, argv: list[str], threads: int) -> list[dict]:
    """Run :func:`torchrun_command` to its end, the job's ``threads`` shared among the ranks (on two
    cores, oversubscribed OpenMP is ~25x slower). A SIGTERM to this job is passed to torchrun (which
    passes it to every rank) and waited for, so the ranks save their checkpoint before the job ends."""
    import signal
    import subprocess

    marker = interrupted_marker(metrics_file)
    marker.unlink(missing_ok=True)
    per_rank = str(max(1, threads // nproc))
    proc = subprocess.Popen(torchrun_command(nproc, metrics_file, argv), stdout=sys.stderr, stderr=sys.stderr,
                            env={**os.environ, "OMP_NUM_THREADS": per_rank, "MKL_NUM_THREADS": per_rank})
    previous = signal.signal(signal.SIGTERM, lambda *_: proc.send_signal(signal.SIGTERM))
    try:
        code = proc.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
    if marker.exists():
        raise TrainingInterrupted(marker.read_text())
    if code != 0:
        raise RuntimeError(f"torchrun with {nproc} processes exited with code {code} (see the rank logs above)")
    return read_validation(metrics_file)


class _ValidationMetrics(logging.Handler):
    """Appends each validation dict speculators logs on ``speculators.metrics`` to a file in the
    run folder, so a resumed run still reports the epochs it did before it was interrupted.

    Each entry carries ``train_s``, the training wall time up to that validation (set-up included),
    so time to quality can be read per epoch. A resumed run adds its own time to the latest recorded
    one; the part of an interrupted epoch after its last validation is not counted."""

    def __init__(self, path: Path):
        super().__init__()
        self.path = path
        self.carried = max((e.get("train_s", 0.0) for e in read_validation(path)), default=0.0)
        self.started = time.monotonic()
        if path.exists() and path.stat().st_size and not path.read_bytes().endswith(b"\n"):
            with path.open("a", encoding="utf-8") as fh:
                fh.write("\n")  # a line cut by a kill stays a line of its own, skipped on reading

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, dict) and "val" in record.msg:
            train_s = round(self.carried + time.monotonic() - self.started, 1)
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps({"epoch": record.msg.get("epoch"), **record.msg["val"], "train_s": train_s})
                         + "\n")
                fh.flush()
                os.fsync(fh.fileno())


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


def _keep_workers_through_sigterm() -> None:
    """Spawned workers run the loop this attribute names (imported there by qualified name)."""
    global _TORCH_WORKER_LOOP
    from torch.utils.data._utils import worker

    if worker._worker_loop is not _worker_loop_ignoring_sigterm:
        _TORCH_WORKER_LOOP = worker._worker_loop
        worker._worker_loop = _worker_loop_ignoring_sigterm


def _track_interruption(trainer_cls, state: dict) -> None:
    """Record where a graceful stop happened (epoch, step within it) for :func:`_resumable`."""
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


def _stop_together_after_a_step(trainer_cls) -> None:
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


def _resumable(save_dir: Path, state: dict) -> str:
    """Turn speculators' ``interrupted`` checkpoint into a mid-epoch one it resumes from."""
    interrupted = save_dir / "interrupted"
    if not (interrupted / "model.safetensors").exists() or "epoch" not in state:
        return "no checkpoint could be saved at the stop; a rerun resumes from the last finished epoch"
    epoch, local_step = state["epoch"], state["global_step"] - state["epoch_start_step"]
    dest = save_dir / str(epoch)
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(interrupted, dest)
    (dest / "training_state.json").write_text(json.dumps({"epoch": epoch, "local_step": local_step,
                                                          "global_step": state["global_step"]}))
    return f"its state at epoch {epoch + 1}, step {local_step} is saved in {dest}; a rerun resumes from there"


def _newton_schulz_fp32(grad, ns_coefficients: tuple[float, float, float], ns_steps: int, eps: float):
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


def _muon_in_fp32() -> None:
    from torch.optim import _muon

    _muon._zeropower_via_newtonschulz = _newton_schulz_fp32


TRAIN_LM_HEAD = "--draftsmith-train-lm-head"  # ours, not speculators': removed before its parser sees it


def _train_lm_head(trainer_cls) -> None:
    """Make the draft LM head trainable: speculators copies the target's and freezes it (SpecForge and
    EAGLE train it). Set before ``setup_model`` wraps the model: DDP and FSDP decide at the wrap which
    parameters they synchronise, so a head made trainable afterwards trains apart on every rank."""
    original = trainer_cls.setup_model

    def setup_model(self, *args, **kwargs):
        self.model.lm_head.weight.requires_grad_(True)
        return original(self, *args, **kwargs)

    trainer_cls.setup_model = setup_model


def _weights_in_fp32(trainer_cls) -> None:
    """A warm-started drafter arrives in its checkpoint's bf16; computing in fp32 (no autocast on a CPU
    without native bf16) needs fp32 weights, as a drafter trained from scratch already has."""
    original = trainer_cls.setup_model

    def setup_model(self, *args, **kwargs):
        self.model.float()
        return original(self, *args, **kwargs)

    trainer_cls.setup_model = setup_model


def _stop_dataloader_workers() -> None:
    """After a failed step the trainer's dataloader workers are still up, and they ignore SIGTERM
    (:func:`_keep_workers_through_sigterm`): multiprocessing's exit handler would wait for them
    forever. The job is failing anyway; end them."""
    import multiprocessing

    for child in multiprocessing.active_children():
        child.kill()


def train(argv: list[str], metrics_file: Path) -> list[dict]:
    """Run speculators' trainer in this process; return validation metrics of every epoch so far.

    Raises :class:`TrainingInterrupted` after a graceful stop (the checkpoint is made resumable).
    """
    check_speculators()
    from speculators.train import cli, trainer
    from speculators.train.config import TrainConfig

    from draftsmith import hs_store  # noqa: F401 - registers the sharded hidden-state backend

    if TRAIN_LM_HEAD in argv:
        argv = [a for a in argv if a != TRAIN_LM_HEAD]
        _train_lm_head(trainer.Trainer)
    config = TrainConfig.resolve(argv)
    if config.flatten()["hidden_states_dtype"] == "float32":
        _muon_in_fp32()  # computing in fp32 because bf16 is not native here: the optimizer too
        _weights_in_fp32(trainer.Trainer)
    collector = _ValidationMetrics(metrics_file)
    setup_metric_logger = cli.setup_metric_logger
    state: dict = {}
    _track_interruption(trainer.Trainer, state)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        _stop_together_after_a_step(trainer.Trainer)
    _keep_workers_through_sigterm()

    def setup_then_collect(*args, **kwargs):
        # speculators configures its loggers with dictConfig inside main(), which replaces any
        # handler attached beforehand; attach ours right after (rank 0 only under torchrun).
        setup_metric_logger(*args, **kwargs)
        if int(os.environ.get("RANK", "0")) == 0:
            logging.getLogger("speculators.metrics").addHandler(collector)

    cli.setup_metric_logger = setup_then_collect
    try:
        cli.main(config)
    except BaseException:
        _stop_dataloader_workers()
        raise
    finally:
        cli.setup_metric_logger = setup_metric_logger
        logging.getLogger("speculators.metrics").removeHandler(collector)
    if state.get("interrupted"):
        where = _resumable(Path(config.flatten()["save_path"]), state) if int(os.environ.get("RANK", "0")) == 0 \
            else "rank 0 saved the checkpoint"
        raise TrainingInterrupted(f"training was interrupted (SIGTERM/SIGINT); {where}")
    return read_validation(metrics_file)


def read_validation(path: Path) -> list[dict]:
    """One entry per epoch (the latest if an epoch was validated twice), in epoch order."""
    by_epoch = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        if line.endswith("}"):  # a line cut by a kill is skipped
            entry = json.loads(line)
            by_epoch[entry["epoch"]] = entry
    return [by_epoch[k] for k in sorted(by_epoch, key=lambda e: (e is None, e))]


def simulated_tau(metrics: dict) -> float:
    """Expected acceptance length of chain drafting from validation accuracies:
    ``1 + sum_k P(the first k+1 drafted tokens are all right)`` = ``1 + sum_k full_acc_k``."""
    steps = sorted(int(k.split("_")[2]) for k in metrics if k.startswith("full_acc_") and k.endswith("_epoch"))
    return 1.0 + sum(metrics[f"full_acc_{k}_epoch"] for k in steps)


def choose_checkpoint(save_dir: Path, validation: list[dict]) -> tuple[Path, dict]:
    """The epoch checkpoint with the best simulated τ (the last one when no epoch was validated)."""
    epochs = {int(p.name): p for p in save_dir.iterdir()
              if p.name.isdigit() and not p.is_symlink() and (p / "model.safetensors").exists()}
    if not epochs:
        raise FileNotFoundError(f"{save_dir}: training wrote no checkpoint with model.safetensors")
    scored = [(simulated_tau(v), v["epoch"]) for v in validation if v.get("epoch") in epochs]
    if not scored:
        last = max(epochs)
        return epochs[last], {"epoch": last, "reason": "last epoch (no validation metrics)", "simulated_tau": None}
    tau, epoch = max(scored)
    return epochs[epoch], {"epoch": epoch, "simulated_tau": tau,
                           "reason": f"best simulated τ {tau:.3f} of {len(scored)} validated epochs"}


def main() -> None:
    """``python -m draftsmith.train METRICS_FILE SPECULATORS_ARGS...``: one worker, e.g. under torchrun."""
    adapt_for_cpu()
    metrics_file = Path(sys.argv[1])
    try:
        train(sys.argv[2:], metrics_file)
    except TrainingInterrupted as stop:
        if int(os.environ.get("RANK", "0")) == 0:
            interrupted_marker(metrics_file).write_text(str(stop))
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
