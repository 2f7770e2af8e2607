"""Train an EAGLE-3 drafter with speculators, on GPU as published or on CPU through a small adaptation.

- **CPU.** speculators' trainer assumes an accelerator in three places: it moves the model and
  batches to ``get_local_rank()`` (int 0, i.e. ``cuda:0``), autocasts with device type ``cuda``
  when no accelerator is found, and synchronises ``torch.accelerator`` in its step timer; its
  checkpointer also maps resumed state to ``cuda:0``. ``speculators_patches.adapt_for_cpu`` redirects
  those to the CPU when no accelerator exists and changes nothing on a GPU machine.
- **Resume.** A checkpoint is saved every epoch; a rerun of the same run key resumes from the last
  one. A graceful stop (SIGTERM from Snakemake or a cluster time limit) makes speculators save an
  ``interrupted`` checkpoint; :func:`train` turns it into a mid-epoch checkpoint that speculators
  resumes from, and the job fails saying so. Under torchrun the ranks stop together after the
  same optimizer step (``speculators_patches.stop_together_after_a_step``).
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

from draftsmith.core import jsonl
from draftsmith.core.atomic import atomic_path
from draftsmith.training import speculators_patches as patches

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
            f"--shutdown-timeout={RANKS_STOP_TIMEOUT_S}", "-m", "draftsmith.training.train", str(metrics_file), *argv]


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

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, dict) and "val" in record.msg:
            train_s = round(self.carried + time.monotonic() - self.started, 1)
            jsonl.append(self.path, [{"epoch": record.msg.get("epoch"), **record.msg["val"], "train_s": train_s}])


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


TRAIN_LM_HEAD = "--draftsmith-train-lm-head"  # ours, not speculators': removed before its parser sees it


def train(argv: list[str], metrics_file: Path) -> list[dict]:
    """Run speculators' trainer in this process; return validation metrics of every epoch so far.

    Raises :class:`TrainingInterrupted` after a graceful stop (the checkpoint is made resumable).
    """
    from speculators.train import cli, trainer
    from speculators.train.config import TrainConfig

    from draftsmith.hidden_states import store  # noqa: F401 - registers the sharded hidden-state backend

    if TRAIN_LM_HEAD in argv:
        argv = [a for a in argv if a != TRAIN_LM_HEAD]
        patches.train_lm_head(trainer.Trainer)
    config = TrainConfig.resolve(argv)
    if config.flatten()["hidden_states_dtype"] == "float32":
        patches.muon_in_fp32()  # computing in fp32 because bf16 is not native here: the optimizer too
        patches.weights_in_fp32(trainer.Trainer)
    state: dict = {}
    patches.track_interruption(trainer.Trainer, state)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        patches.stop_together_after_a_step(trainer.Trainer)
    patches.keep_workers_through_sigterm()
    try:
        with patches.metrics_to(_ValidationMetrics(metrics_file)):
            cli.main(config)
    except BaseException:
        patches.stop_dataloader_workers()
        raise
    if state.get("interrupted"):
        where = _resumable(Path(config.flatten()["save_path"]), state) if int(os.environ.get("RANK", "0")) == 0 \
            else "rank 0 saved the checkpoint"
        raise TrainingInterrupted(f"training was interrupted (SIGTERM/SIGINT); {where}")
    return read_validation(metrics_file)


def read_validation(path: Path) -> list[dict]:
    """One entry per epoch (the latest if an epoch was validated twice), in epoch order."""
    by_epoch = {}
    for entry in jsonl.read_appended(path):
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
    """``python -m draftsmith.training.train METRICS_FILE SPECULATORS_ARGS...``: one worker, e.g. under torchrun."""
    patches.adapt_for_cpu()
    metrics_file = Path(sys.argv[1])
    try:
        train(sys.argv[2:], metrics_file)
    except TrainingInterrupted as stop:
        if int(os.environ.get("RANK", "0")) == 0:
            interrupted_marker(metrics_file).write_text(str(stop))
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
