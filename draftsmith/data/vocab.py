"""The draft vocabulary: which target tokens the drafter can propose (d2t / t2d).

Built from token frequencies under the loss mask of the *training* split only, with speculators'
own builder, and kept as a pinned artifact: the trainer is given these exact files, and a warm
start from a pretrained drafter reuses that drafter's mapping instead of silently re-deriving one
that no longer matches its LM head.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from draftsmith.core.atomic import atomic_path, write_json
from draftsmith.data.merge import TRAIN

log = logging.getLogger(__name__)


def token_frequencies(merged: Path) -> Counter[int]:
    """Supervised-token counts of the training split (the split column the merge wrote)."""
    table = pq.read_table(merged, columns=["input_ids", "loss_mask", "split"])
    table = table.filter(pc.equal(table.column("split"), TRAIN))
    freq: Counter[int] = Counter()
    for ids, mask in zip(table.column("input_ids").to_pylist(), table.column("loss_mask").to_pylist(), strict=True):
        freq.update(t for t, m in zip(ids, mask, strict=True) if m)
    return freq


def _coverage(freq: Counter[int], t2d) -> float:
    total = sum(freq.values())
    return sum(n for tok, n in freq.items() if bool(t2d[tok])) / total if total else 0.0


def build(merged: Path, draft_vocab_size: int, target_vocab_size: int, d2t_out: Path,
          t2d_out: Path, stats_out: Path) -> dict:
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    freq = token_frequencies(merged)
    if not freq:
        raise ValueError(f"{merged}: no supervised tokens in the training split")
    size = min(draft_vocab_size, target_vocab_size)
    d2t, t2d = build_vocab_mappings_from_distribution(dict(freq), size, target_vocab_size)
    if len(freq) < size:
        log.warning("only %d distinct supervised tokens for a draft vocabulary of %d; the rest is filled with "
                    "the lowest unused token ids (more data, or a smaller vocab.draft_vocab_size)", len(freq), size)
    for tensor, out in ((d2t, d2t_out), (t2d, t2d_out)):
        with atomic_path(out, suffix=".npy") as tmp, tmp.open("wb") as fh:
            np.save(fh, tensor.numpy())
    stats = {"source": "built from the training split", "draft_vocab_size": size,
             "filled_without_data": max(0, size - len(freq)), "target_vocab_size": target_vocab_size,
             "unique_supervised_tokens": len(freq), "supervised_tokens": sum(freq.values()),
             "coverage": _coverage(freq, t2d), **_digests(d2t_out, t2d_out)}
    write_json(stats_out, stats)
    return stats


def copy_pretrained(pretrained: Path, merged: Path, d2t_out: Path, t2d_out: Path, stats_out: Path) -> dict:
    """Pin the warm-start drafter's own mapping (byte for byte) and say how well it covers our data."""
    check = json.loads((pretrained / "check.json").read_text())
    for name, out in (("d2t.npy", d2t_out), ("t2d.npy", t2d_out)):
        with atomic_path(out, suffix=".npy") as tmp:
            shutil.copyfile(pretrained / name, tmp)
    digests = _digests(d2t_out, t2d_out)
    if (digests["d2t_sha256"], digests["t2d_sha256"]) != (check["d2t_sha256"], check["t2d_sha256"]):
        raise OSError(f"{pretrained}: the mapping changed while it was copied; rerun")
    freq = token_frequencies(merged)
    t2d = np.load(t2d_out)
    stats = {"source": f"pretrained drafter {check['source']}", "draft_vocab_size": int(np.load(d2t_out).shape[0]),
             "target_vocab_size": int(t2d.shape[0]), "unique_supervised_tokens": len(freq),
             "supervised_tokens": sum(freq.values()), "coverage": _coverage(freq, t2d), **digests}
    write_json(stats_out, stats)
    return stats


def _digests(d2t: Path, t2d: Path) -> dict:
    from draftsmith.core.digest import file_sha256

    return {"d2t_sha256": file_sha256(d2t), "t2d_sha256": file_sha256(t2d)}
