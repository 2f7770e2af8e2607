"""Train an EAGLE-3 drafter with speculators, on GPU as published or on CPU through a small adaptation.

speculators' trainer assumes an accelerator in three places: it moves the model and batches to
``get_local_rank()`` (int 0, i.e. ``cuda:0``), autocasts with device type ``cuda`` when no
accelerator is found, and synchronises ``torch.accelerator`` in its step timer; its checkpointer
also maps resumed state to ``cuda:0``. :func:`adapt_for_cpu` redirects exactly those to the CPU
when no accelerator exists and changes nothing on a GPU machine.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

import pyarrow.parquet as pq

from draftsmith.atomic import atomic_path, write_json

log = logging.getLogger(__name__)


def adapt_for_cpu() -> bool:
    """Patch speculators' trainer for a machine without an accelerator; return whether it did."""
    import torch

    if torch.accelerator.is_available():
        return False
    from speculators.train import checkpointer, trainer

    original_init = trainer.Trainer.__init__

    def init_on_cpu(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self.device_type = "cpu"  # autocast target; speculators falls back to "cuda"

    trainer.get_local_rank = lambda: "cpu"  # __init__ moves the model to this before returning
    trainer.Trainer.__init__ = init_on_cpu
    trainer.torch.accelerator.synchronize = lambda *a, **k: None  # nothing to wait for on the CPU
    checkpointer.get_current_device = lambda: "cpu"
    return True


def run_key(parts: dict) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def assemble_training_dir(merged: Path, hidden_states: dict[str, Path], dest: Path) -> None:
    """Write the folder speculators reads: an arrow dataset plus ``hidden_states/hs_<i>`` links.

    Files are hard-linked (no extra disk) from the per-dataset extraction folders, renumbered
    to the merged order.
    """
    from datasets import Dataset

    table = pq.read_table(merged, columns=["input_ids", "loss_mask", "seq_len", "dataset", "source_row"])
    with atomic_path(dest) as tmp:
        ds = Dataset.from_dict({"input_ids": table.column("input_ids").to_pylist(),
                                "loss_mask": table.column("loss_mask").to_pylist(),
                                "seq_len": table.column("seq_len").to_pylist()})
        ds.set_format(type="torch")
        ds.save_to_disk(str(tmp))
        links = tmp / "hidden_states"
        links.mkdir()
        for i, (name, row) in enumerate(zip(table.column("dataset").to_pylist(),
                                            table.column("source_row").to_pylist(), strict=True)):
            src = hidden_states[name] / f"hs_{row}.safetensors"
            try:
                os.link(src, links / f"hs_{i}.safetensors")
            except OSError:
                shutil.copyfile(src, links / f"hs_{i}.safetensors")


def speculators_args(cfg: dict, *, verifier: str, data_dir: Path, save_dir: Path, d2t: Path, t2d: Path,
                     aux_layers: list[int], train_ratio: float, on_cpu: bool, log_dir: Path) -> list[str]:
    args = {
        "speculator-type": "eagle3",
        "verifier-name-or-path": verifier,
        "data-path": str(data_dir),
        "save-path": str(save_dir),
        "d2t-path": str(d2t),
        "t2d-path": str(t2d),
        "target-layer-ids": aux_layers,
        "train-data-ratio": train_ratio,
        "num-layers": cfg["num_layers"],
        "epochs": cfg["epochs"],
        "lr": cfg["lr"],
        "total-seq-len": cfg["total_seq_len"],
        "ttt-steps": cfg["ttt_steps"],
        "seed": cfg["seed"],
        "num-workers": cfg["num_workers"],
        "log-dir": str(log_dir),
    }
    if cfg.get("max_steps"):
        args["max-steps"] = cfg["max_steps"]
    if cfg.get("from_pretrained"):
        args["from-pretrained"] = cfg["from_pretrained"]
    if on_cpu:
        # The fused loss is a Triton kernel and FlexAttention has no CPU backward.
        args["loss-implementation"] = "eager"
        args["draft-attn-impl"] = "sdpa"
    argv = []
    for key, value in args.items():
        argv += [f"--{key}", *map(str, value)] if isinstance(value, list) else [f"--{key}", str(value)]
    return argv


class _ValidationMetrics(logging.Handler):
    """Appends each validation dict speculators logs on ``speculators.metrics`` to a file in the
    run folder, so a resumed run still reports the epochs it did before it was interrupted."""

    def __init__(self, path: Path):
        super().__init__()
        self.path = path

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, dict) and "val" in record.msg:
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps({"epoch": record.msg.get("epoch"), **record.msg["val"]}) + "\n")
                fh.flush()
                os.fsync(fh.fileno())


def train(argv: list[str], metrics_file: Path) -> list[dict]:
    """Run speculators' trainer in this process; return validation metrics of every epoch so far."""
    from speculators.train import cli
    from speculators.train.config import TrainConfig

    collector = _ValidationMetrics(metrics_file)
    setup_metric_logger = cli.setup_metric_logger

    def setup_then_collect(*args, **kwargs):
        # speculators configures its loggers with dictConfig inside main(), which replaces any
        # handler attached beforehand; attach ours right after.
        setup_metric_logger(*args, **kwargs)
        logging.getLogger("speculators.metrics").addHandler(collector)

    cli.setup_metric_logger = setup_then_collect
    try:
        cli.main(TrainConfig.resolve(argv))
    finally:
        cli.setup_metric_logger = setup_metric_logger
        logging.getLogger("speculators.metrics").removeHandler(collector)
    return read_validation(metrics_file)


def read_validation(path: Path) -> list[dict]:
    """One entry per epoch (the latest if an epoch was validated twice), in epoch order."""
    by_epoch = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        if line.endswith("}"):  # a line cut by a kill is skipped
            entry = json.loads(line)
            by_epoch[entry["epoch"]] = entry
    return [by_epoch[k] for k in sorted(by_epoch, key=lambda e: (e is None, e))]


def latest_checkpoint(save_dir: Path) -> Path:
    found = sorted((p.parent for p in save_dir.rglob("model.safetensors") if (p.parent / "config.json").exists()),
                   key=lambda p: p.stat().st_mtime)
    if not found:
        raise FileNotFoundError(f"{save_dir}: training wrote no checkpoint with model.safetensors and config.json")
    return found[-1]


def export(checkpoint: Path, weights_out: Path, config_out: Path, verifier_ref: str) -> dict:
    """Copy the checkpoint to the drafter folder with a portable verifier reference, and check it."""
    check_drafter(checkpoint / "model.safetensors", checkpoint / "config.json")
    config = json.loads((checkpoint / "config.json").read_text())
    config["speculators_config"]["verifier"]["name_or_path"] = verifier_ref
    with atomic_path(weights_out) as tmp:
        shutil.copyfile(checkpoint / "model.safetensors", tmp)
    write_json(config_out, config)
    return config


def check_drafter(weights: Path, config_path: Path) -> dict[str, list[int]]:
    """Refuse a checkpoint missing the tensors vLLM needs to map draft tokens (d2t/t2d) or fuse layers."""
    from safetensors import safe_open

    config = json.loads(config_path.read_text())
    hidden = config["transformer_layer_config"]["hidden_size"]
    with safe_open(weights, framework="pt") as fh:
        shapes = {k: list(fh.get_slice(k).get_shape()) for k in fh.keys()}  # noqa: SIM118 - safe_open is not a dict
    for key in ("d2t", "t2d", "fc.weight", "lm_head.weight"):
        if key not in shapes:
            raise ValueError(f"{weights}: drafter has no {key!r} tensor")
    if shapes["fc.weight"] != [hidden, 3 * hidden]:
        raise ValueError(f"{weights}: fc.weight is {shapes['fc.weight']}, expected [{hidden}, {3 * hidden}]")
    if shapes["d2t"][0] != shapes["lm_head.weight"][0]:
        raise ValueError(f"{weights}: d2t has {shapes['d2t'][0]} entries but lm_head has {shapes['lm_head.weight'][0]}")
    return shapes
