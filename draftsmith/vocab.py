"""The draft vocabulary: which target tokens the drafter can propose (d2t / t2d).

Built from token frequencies under the loss mask of the *training* split only, with speculators'
own builder, and kept as a pinned artifact: the trainer is given these exact files, and a warm
start from a pretrained drafter reuses that drafter's mapping instead of silently re-deriving one
that no longer matches its LM head.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from draftsmith.atomic import atomic_path, write_json

log = logging.getLogger(__name__)


def token_frequencies(merged: Path, train_rows: int) -> Counter[int]:
    table = pq.read_table(merged, columns=["input_ids", "loss_mask"]).slice(0, train_rows)
    freq: Counter[int] = Counter()
    for ids, mask in zip(table.column("input_ids").to_pylist(), table.column("loss_mask").to_pylist(), strict=True):
        freq.update(t for t, m in zip(ids, mask, strict=True) if m)
    return freq


def build(merged: Path, train_rows: int, draft_vocab_size: int, target_vocab_size: int, d2t_out: Path,
          t2d_out: Path, stats_out: Path) -> dict:
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    freq = token_frequencies(merged, train_rows)
    if not freq:
        raise ValueError(f"{merged}: no supervised tokens in the training split")
    size = min(draft_vocab_size, target_vocab_size)
    d2t, t2d = build_vocab_mappings_from_distribution(dict(freq), size, target_vocab_size)
    covered = sum(n for tok, n in freq.items() if bool(t2d[tok]))
    if len(freq) < size:
        log.warning("only %d distinct supervised tokens for a draft vocabulary of %d; the rest is filled with "
                    "the lowest unused token ids (more data, or a smaller vocab.draft_vocab_size)", len(freq), size)
    stats = {"draft_vocab_size": size, "filled_without_data": max(0, size - len(freq)),
             "target_vocab_size": target_vocab_size, "unique_supervised_tokens": len(freq),
             "supervised_tokens": sum(freq.values()), "coverage": covered / sum(freq.values())}
    for tensor, out in ((d2t, d2t_out), (t2d, t2d_out)):
        with atomic_path(out, suffix=".npy") as tmp, tmp.open("wb") as fh:
            np.save(fh, tensor.numpy())
    write_json(stats_out, stats)
    return stats
