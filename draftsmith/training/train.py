"""Train a drafter (EAGLE-3, DFlash or DSpark) with speculators, on GPU as published or on CPU through a
small adaptation.

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
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq

from draftsmith.core import jsonl, platform
from draftsmith.core.atomic import atomic_path, write_json
from draftsmith.training import families
from draftsmith.training import speculators_patches as patches
from draftsmith.training.export import basis_text

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


def adopt_earlier_run(runs_dir: Path, key: str, family: str) -> bool:
    """Move an EAGLE-3 run made before families existed (``results/train_runs/<key>/``: the same key, one
    folder up) to where this family's runs are, so its checkpoints resume instead of training again.
    Returns whether one was moved."""
    earlier, here = runs_dir.parent / key, runs_dir / key
    if family != families.DEFAULT_FAMILY or here.exists() or not (earlier / "checkpoints").is_dir():
        return False
    here.parent.mkdir(parents=True, exist_ok=True)
    os.replace(earlier, here)
    return True


def speculators_args(cfg: dict, *, verifier: str, data_dir: Path, save_dir: Path, d2t: Path, t2d: Path,
                     aux_layers: list[int], train_ratio: float, device: str, log_dir: Path, num_workers: int,
                     from_pretrained: Path | None = None, hidden_states_backend: str = "file",
                     vllm_endpoint: str | None = None, dtype: str = "bfloat16",
                     trust_remote_code: bool = False, loss_implementation: str = "eager",
                     compile_: bool = False, mask_token_id: int | None = None) -> list[str]:
    """speculators' training arguments, and draftsmith's own flags (removed before its parser sees
    them): ``loss_implementation`` and ``compile_`` as :func:`draftsmith.training.probe.choose` decided on
    ``device`` (the trainer's: ``cuda`` or ``cpu``), and the draft attention that follows from both
    (:func:`draftsmith.core.platform.draft_attention`). ``cfg`` is one family's settings
    (:func:`draftsmith.training.families.settings`); a block family needs its ``mask_token_id``
    (:func:`choose_mask_token`)."""
    family = cfg.get("family", families.DEFAULT_FAMILY)
    args: dict = {
        "hidden-states-dtype": dtype,
        "speculator-type": family,
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
        "seed": cfg["seed"],
        "num-workers": num_workers,
        "checkpoint-freq": 1,
        "log-dir": str(log_dir),
        "hidden-states-backend": hidden_states_backend,
        "loss-implementation": loss_implementation,
    }
    for key, flag in (("max_steps", "max-steps"), ("warmup_steps", "scheduler-warmup-steps"),
                      ("warmup_ratio", "scheduler-warmup-ratio")):
        if cfg.get(key) is not None:
            args[flag] = cfg[key]
    if family != families.DEFAULT_FAMILY:
        args.update(_block_family_args(cfg, mask_token_id))
    elif from_pretrained:  # the checkpoint defines the draft model: its layers and architecture
        args.update({"from-pretrained": str(from_pretrained), **_eagle3_args(cfg)})
    else:
        args.update({"num-layers": cfg["num_layers"], "draft-arch": cfg["draft_arch"], **_eagle3_args(cfg)})
    if vllm_endpoint:
        args.update({"vllm-endpoint": vllm_endpoint, "on-missing": "generate"})
    else:
        args["on-missing"] = "raise"  # offline: a missing hidden state is a bug, never a silent skip
    args["draft-attn-impl"] = platform.draft_attention(device, compile_)
    argv = []
    for key, value in args.items():
        argv += [f"--{key}", *map(str, value)] if isinstance(value, list) else [f"--{key}", str(value)]
    if family == families.DEFAULT_FAMILY:
        argv += eagle3_model_flags(cfg, from_pretrained)
    return argv + (["--trust-remote-code"] if trust_remote_code else []) + ([] if compile_ else [NO_COMPILE])


def _eagle3_args(cfg: dict) -> dict:
    return {"ttt-steps": cfg["ttt_steps"], "ttt-step-loss-decay": cfg["ttt_step_loss_decay"], "loss-fn": cfg["loss_fn"]}


def eagle3_model_flags(cfg: dict, from_pretrained: Path | None = None) -> list[str]:
    """speculators' flags that shape an EAGLE-3 drafter (architecture, fc norm, trained LM head) from the training
    settings ``cfg``: what training passes, and what the engine check builds its random drafter with, so that the
    drafter it serves is the one training will export (a warm start's checkpoint brings its own architecture)."""
    model_flags = [] if from_pretrained else list(ARCHITECTURE_FLAGS[cfg["architecture"]])
    if cfg["fc_norm"] and not from_pretrained:
        # EAGLE-3.1's per-layer norm replaces the one norm before fc (speculators refuses both)
        model_flags += ["--fc-norm"] + ([] if NO_NORM_BEFORE_FC in model_flags else [NO_NORM_BEFORE_FC])
    return model_flags + ([TRAIN_LM_HEAD] if cfg["train_lm_head"] else [])


def _block_family_args(cfg: dict, mask_token_id: int | None) -> dict:
    """DFlash and DSpark: speculators' own defaults where the settings leave a value out. Every draft
    layer stays sliding-window and causal inside its block (speculators' default), which is what vLLM
    serves (:func:`draftsmith.training.export.attention_refusal`)."""
    if mask_token_id is None:
        raise ValueError(f"a {cfg['family']} drafter needs a mask token id (choose_mask_token)")
    args = {"mask-token-id": mask_token_id}
    for key, flag in (("num_layers", "num-layers"), ("block_size", "block-size"), ("loss_fn", "loss-fn")):
        if cfg.get(key) is not None:
            args[flag] = cfg[key]
    return args


# How long torchrun waits for its ranks after passing on a stop signal before it kills them (its own
# default, 30 s, can cut the interrupt checkpoint short): a step to finish plus speculators' save,
# which gives up after 120 s.
RANKS_STOP_TIMEOUT_S = 180


SHUTDOWN_TIMEOUT_FLAG = "--shutdown-timeout"


def torchrun_accepts(flag: str) -> bool:
    """Whether the installed torchrun takes ``flag`` (``--shutdown-timeout`` came with torch 2.12;
    clusters, containers and the lent H200 run older ones, which refuse unknown flags)."""
    from torch.distributed.run import get_args_parser

    return flag in get_args_parser()._option_string_actions


def torchrun_command(nproc: int, metrics_file: Path, argv: list[str], shutdown_timeout: bool) -> list[str]:
    """Several training processes (one per GPU; gloo ranks on a CPU): the same worker as a
    single-process run, under torchrun. ``shutdown_timeout``: whether this torchrun takes
    :data:`SHUTDOWN_TIMEOUT_FLAG` (:func:`torchrun_accepts`)."""
    wait = [f"{SHUTDOWN_TIMEOUT_FLAG}={RANKS_STOP_TIMEOUT_S}"] if shutdown_timeout else []
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *wait,
            "-m", "draftsmith.training.train", str(metrics_file), *argv]


def _stop_ranks(torchrun, shutdown_timeout: bool) -> None:
    """Pass a stop to the ranks. A torchrun that takes --shutdown-timeout waits that long for them;
    an older one kills them 30 s after it is signalled, which can cut the interrupt checkpoint short:
    there the ranks (torchrun's children) are signalled themselves, torchrun not at all, and it exits
    once they have saved and stopped."""
    import signal

    import psutil

    if shutdown_timeout:
        torchrun.send_signal(signal.SIGTERM)
        return
    for rank in psutil.Process(torchrun.pid).children():
        rank.send_signal(signal.SIGTERM)


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
    shutdown_timeout = torchrun_accepts(SHUTDOWN_TIMEOUT_FLAG)
    if not shutdown_timeout:
        log.warning("this torchrun has no %s: a stop from the workflow goes to the ranks themselves; a "
                    "SIGTERM to torchrun itself (a cluster's) gives them its fixed 30 s to save",
                    SHUTDOWN_TIMEOUT_FLAG)
    proc = subprocess.Popen(torchrun_command(nproc, metrics_file, argv, shutdown_timeout), stdout=sys.stderr,
                            stderr=sys.stderr, env={**os.environ, "OMP_NUM_THREADS": per_rank,
                                                    "MKL_NUM_THREADS": per_rank, LAUNCHED_AT: str(time.time())})
    previous = signal.signal(signal.SIGTERM, lambda *_: _stop_ranks(proc, shutdown_timeout))
    try:
        code = proc.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
    if marker.exists():
        raise TrainingInterrupted(marker.read_text())
    if code != 0:
        raise RuntimeError(f"torchrun with {nproc} processes exited with code {code} (see the rank logs above)")
    phases = json.loads(phases_file(metrics_file).read_text())
    phases["exit_s"] = round(time.time() - phases["done_at"], 1)  # from the work's end to torchrun's
    log.info("trainer: the processes exited %.1f s after their work was done", phases["exit_s"])
    write_json(phases_file(metrics_file), phases)
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
NO_COMPILE = "--draftsmith-no-compile"  # likewise: speculators' compiled forward runs eagerly
OWN_FLAGS = (TRAIN_LM_HEAD, NO_COMPILE)
LAUNCHED_AT = "DRAFTSMITH_TRAIN_LAUNCHED_AT"  # the job's wall clock when it started the trainer's processes
HEARTBEAT_S = 60.0


class Phases:
    """Where a training job's time goes, logged as it happens and kept in ``phases.json`` beside the
    metrics (rank 0): launch (process start and imports), build (model, optimizer, data), the first
    step (compilation included; ``compile_s`` is dynamo's own count), the first validation, the
    steady steps per second, and the work's end. A heartbeat line every :data:`HEARTBEAT_S` names the
    phase and the steps done, of how many, and the time the rest take at the steady pace (validations not
    counted), so a stall shows as a stall, never as silence."""

    def __init__(self, path: Path, launched_at: float | None = None, clock=time.monotonic):
        self.path = path
        self.clock = clock
        self.started = clock()
        self.wall_started = time.time()
        self.seconds: dict[str, float] = {"launch_s": round(self.wall_started - launched_at, 1)} if launched_at \
            else {}
        self.phase, self.phase_since = "build", self.started
        self.steps, self.steady_steps, self.steady_s = 0, 0, 0.0
        self.total: int | None = None  # the run's steps, every epoch (:meth:`plan`)
        self.before = 0  # the run's steps before this epoch's (a resumed run's earlier epochs included)
        self.in_epoch = 0
        self.last_step: float | None = None
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.heartbeat = threading.Thread(target=self._beat, name="trainer-heartbeat", daemon=True)

    def __enter__(self) -> Phases:
        log.info("trainer: started%s", f" {self.seconds['launch_s']:.1f} s after its launch"
                 if "launch_s" in self.seconds else "")
        self.heartbeat.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.heartbeat.join()

    def _beat(self) -> None:
        while not self.stop.wait(HEARTBEAT_S):
            with self.lock:
                log.info("trainer: %s for %.0f s, %s", self.phase, self.clock() - self.phase_since, self.progress())

    def progress(self) -> str:
        """The steps done, of the run's, and the time the rest take at the steady pace."""
        if not self.total:
            return f"{self.steps} steps done"
        done = self.before + self.in_epoch
        text = f"step {done} of {self.total}"
        if self.steady_steps and self.steady_s:
            left = (self.total - done) * self.steady_s / self.steady_steps
            text += f", ~{left / 60:.0f} min of steps left" if left >= 600 else f", ~{left:.0f} s of steps left"
        return text

    def plan(self, total: int, before: int) -> None:
        """The run's ``total`` steps, and how many of them came before the epoch starting (a resumed run's)."""
        with self.lock:
            self.total, self.before, self.in_epoch = total, before, 0

    def _record(self, name: str, now: float) -> None:
        self.seconds[name] = round(now - self.started, 1)
        log.info("trainer: %s done %.1f s after start", name.removesuffix("_s").replace("_", " "),
                 self.seconds[name])
        self.write()

    def mark(self, name: str) -> None:
        with self.lock:
            self._record(f"{name}_s", self.clock())

    def enter(self, phase: str) -> None:
        with self.lock:
            self.phase, self.phase_since = phase, self.clock()
            self.last_step = None  # the time between epochs is not a step

    def step(self) -> None:
        now = self.clock()
        with self.lock:
            self.steps += 1
            self.in_epoch += 1
            if self.steps == 1:
                self._record("first_step_s", now)
            elif self.last_step is not None:
                self.steady_steps += 1
                self.steady_s += now - self.last_step
            self.last_step = now

    def validated(self) -> None:
        with self.lock:
            if "first_validation_s" not in self.seconds:
                self.seconds["first_validation_s"] = round(self.clock() - self.phase_since, 1)
                log.info("trainer: first validation took %.1f s", self.seconds["first_validation_s"])
            self.phase, self.phase_since = "between epochs", self.clock()

    def done(self) -> None:
        with self.lock:
            self.phase = "exiting"
            self._record("done_s", self.clock())

    def as_dict(self) -> dict:
        out = {**self.seconds, "steps": self.steps, "compile_s": compile_seconds(), "done_at": time.time()}
        if self.steady_steps:
            out["steps_per_s"] = round(self.steady_steps / self.steady_s, 3) if self.steady_s else None
        return out

    def write(self) -> None:
        if int(os.environ.get("RANK", "0")) == 0:
            write_json(self.path, self.as_dict())


def compile_seconds() -> float | None:
    """Seconds dynamo spent compiling in this process (its own count), None where torch keeps none."""
    try:  # a private table of torch's: another release may move or reshape it
        from torch._dynamo.utils import compilation_time_metrics

        return round(sum(sum(times) for times in compilation_time_metrics.values()), 1)
    except (ImportError, AttributeError, TypeError):
        return None


def phases_file(metrics_file: Path) -> Path:
    return metrics_file.with_name("phases.json")


def train(argv: list[str], metrics_file: Path) -> list[dict]:
    """Run speculators' trainer in this process; return validation metrics of every epoch so far.

    Raises :class:`TrainingInterrupted` after a graceful stop (the checkpoint is made resumable).
    """
    from speculators.train import cli, trainer
    from speculators.train.config import TrainConfig

    from draftsmith.hidden_states import store  # noqa: F401 - registers the sharded hidden-state backend

    if TRAIN_LM_HEAD in argv:
        patches.train_lm_head(trainer.Trainer)
    if NO_COMPILE in argv:
        import torch._dynamo

        torch._dynamo.config.disable = True
    argv = [a for a in argv if a not in OWN_FLAGS]
    config = TrainConfig.resolve(argv)
    if config.flatten()["hidden_states_dtype"] == "float32":
        patches.muon_in_fp32()  # computing in fp32 because bf16 is not native here: the optimizer too
        patches.weights_in_fp32(trainer.Trainer)
    state: dict = {}
    patches.track_interruption(trainer.Trainer, state)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        patches.stop_together_after_a_step(trainer.Trainer)
    patches.keep_workers_through_sigterm()
    launched_at = os.environ.get(LAUNCHED_AT)
    with Phases(phases_file(metrics_file), float(launched_at) if launched_at else None) as phases:
        patches.time_phases(trainer.Trainer, phases)
        try:
            with patches.metrics_to(_ValidationMetrics(metrics_file)):
                cli.main(config)
        finally:
            # The dataloader's workers ignore SIGTERM (keep_workers_through_sigterm), and
            # multiprocessing's exit handler would wait for any left: the work is done or failed.
            patches.stop_dataloader_workers()
        phases.done()
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
    """Expected acceptance length from validation accuracies. EAGLE-3 (chain drafting):
    ``1 + sum_k P(the first k+1 drafted tokens are all right)`` = ``1 + sum_k full_acc_k``. A block
    family: speculators' own ``eal``, the mean accepted run per block plus the bonus token."""
    if "eal_epoch" in metrics:
        return metrics["eal_epoch"]
    return 1.0 + sum(metrics[key] for key, _ in families.step_accuracies(metrics))


def epoch_checkpoints(save_dir: Path) -> dict[int, Path]:
    """Each epoch's checkpoint folder (speculators names them by epoch)."""
    epochs = {int(p.name): p for p in save_dir.iterdir()
              if p.name.isdigit() and not p.is_symlink() and (p / "model.safetensors").exists()}
    if not epochs:
        raise FileNotFoundError(f"{save_dir}: training wrote no checkpoint with model.safetensors")
    return epochs


def finished(metrics_file: Path, save_dir: Path, epochs: int) -> list[dict] | None:
    """The validation of a run that trained and validated every one of its ``epochs`` (its job run again: nothing
    to train, no target to serve online), else None."""
    if not (metrics_file.is_file() and phases_file(metrics_file).is_file() and save_dir.is_dir()):
        return None
    validation = read_validation(metrics_file)
    try:
        saved = set(epoch_checkpoints(save_dir))
    except FileNotFoundError:
        return None
    return validation if set(range(epochs)) <= saved & {v.get("epoch") for v in validation} else None


def choose_checkpoint(save_dir: Path, validation: list[dict]) -> tuple[Path, dict]:
    """The epoch checkpoint a server would accept most from: the best predicted served tokens per step on the
    validation rows whose answers do not loop (:mod:`draftsmith.training.replay`, where every validated epoch
    has it; on every row where all loop), at the draft length the pick serves, labelled exact or estimate;
    else the best simulated τ, saying why no prediction chose (the last checkpoint when no epoch was
    validated)."""
    epochs = epoch_checkpoints(save_dir)
    predicted = [(served_figure(v["predicted_served"]), v["epoch"]) for v in validation
                 if v.get("epoch") in epochs and served_figure(v.get("predicted_served") or {})]
    if predicted and len(predicted) == sum(v.get("epoch") in epochs for v in validation):
        tau, epoch = max(predicted)
        figures = next(v for v in validation if v["epoch"] == epoch)
        served = figures["predicted_served"]
        plain = served.get("without_looping_rows") or {}
        rows = f"{plain['rows']} validation rows whose answers do not loop" if plain.get("rows") else \
            f"{served['rows']} validation rows"
        at = f" at k={served['k']}" if served.get("k") else ""
        return epochs[epoch], {"epoch": epoch, "simulated_tau": simulated_tau(figures), "predicted_served_tau": tau,
                               "k": served.get("k"), "exactness": served.get("exactness"),
                               "reason": f"best predicted served τ {tau:.3f}{at} (the drafter replayed on {rows}, "
                                         f"as a server drafts and verifies; {basis_text(served.get('exactness'))}) "
                                         f"of {len(predicted)} epochs; speculators' simulated τ there "
                                         f"{simulated_tau(figures):.3f}"}
    scored = [(simulated_tau(v), v["epoch"]) for v in validation if v.get("epoch") in epochs]
    if not scored:
        last = max(epochs)
        return epochs[last], {"epoch": last, "reason": "last epoch (no validation metrics)", "simulated_tau": None}
    tau, epoch = max(scored)
    why_not = next(filter(None, map(predicted_missing, validation)), None)
    return epochs[epoch], {"epoch": epoch, "simulated_tau": tau, "predicted_missing": why_not,
                           "reason": f"best simulated τ {tau:.3f} of {len(scored)} validated epochs"
                                     + (f"; no predicted served τ: {why_not}" if why_not else "")}


def predicted_missing(entry: dict) -> str | None:
    """Why an epoch's entry has no predicted served figures: the replay failed (its error) or was skipped
    (``predicted_served_skipped``: online hidden states, no rows); None where it has them or predates both."""
    if entry.get("predicted_served_failed"):
        return f"the replay failed ({entry['predicted_served_failed']})"
    return entry.get("predicted_served_skipped")


def served_figure(predicted: dict) -> float | None:
    """The predicted served τ a checkpoint is chosen by: over the rows whose answers do not loop, or every row
    where all of them do."""
    plain = predicted.get("without_looping_rows") or {}
    return plain.get("tokens_per_step") if plain.get("rows") else predicted.get("tokens_per_step")


def token_ids(merged: Path) -> set[int]:
    """Every token id the tokenized data contains (prompts and answers, every split), read a batch of
    rows at a time: the merged table of a large run holds billions of tokens."""
    import pyarrow.compute as pc

    found: set[int] = set()
    for batch in pq.ParquetFile(merged).iter_batches(columns=["input_ids"]):
        found.update(pc.unique(pc.list_flatten(batch.column("input_ids"))).to_pylist())
    return found


def choose_mask_token(configured: int | None, tokenizer, vocab_size: int,
                      data_tokens: Callable[[], set[int]]) -> tuple[int, str]:
    """The token a block drafter reads at the positions it drafts (DFlash's mask), and why. Its embedding
    is the target's, frozen: a token the data also contains would make a drafted position look like
    that token. In order: the configured id; the tokenizer's mask token; an embedding row past the
    tokenizer's last token (never in any text); the last special token the tokenized data never
    contains. speculators' own fallback, the pad id, is often the end-of-turn token, on every row."""
    if configured is not None:
        return configured, "configured"
    if tokenizer.mask_token_id is not None:
        return tokenizer.mask_token_id, f"the tokenizer's mask token {tokenizer.mask_token!r}"
    if len(tokenizer) < vocab_size:
        return len(tokenizer), f"an embedding row past the tokenizer's {len(tokenizer)} tokens"
    unused = sorted((set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)) - data_tokens())
    if not unused:
        raise ValueError("no mask token for a block drafter: the tokenizer has no mask token, no spare embedding "
                         "row, and the data contains every special token; set train.<family>.mask_token_id")
    return unused[-1], f"special token {tokenizer.convert_ids_to_tokens(unused[-1])!r}, never in the data"


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
    # Everything this worker writes is closed by now. On the lent H200 a finished worker had not exited
    # 33 s after its last validation; nothing left in this process may hold the job: exit without
    # running interpreter teardown (threads, atexit handlers, CUDA and NCCL finalizers).
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
