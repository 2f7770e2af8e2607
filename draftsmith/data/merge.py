"""Merge per-dataset token tables into one training table: the train/validation split is made here,
once, and every later stage reads it from the ``split`` column.

- **Split by prompt.** Rows are grouped by ``(dataset, prompt_id)`` (a multi-turn conversation
  tokenized per turn gives several rows of one prompt); a seeded shuffle of the groups puts the
  last ``validation_fraction`` of them in validation, and at least :data:`MIN_VALIDATION_PROMPTS`
  (a quarter of a smaller set): the demo's 10% were 8 answers, two of them loops, and one row moved
  the third draft step's accuracy by half. No prompt is in both splits.
- **Mixture weights** resample each dataset's *training* rows (seeded): a weight below 1 keeps
  that share, above 1 repeats rows (whole copies, then a random remainder). Validation rows are
  kept as they are, so validation measures the natural mix.
- **Order.** Training rows first (shuffled), then validation rows: speculators splits by position
  (:func:`train_ratio` gives it the exact boundary).

Each row keeps its dataset and row number (``source_row``) so that hidden states extracted per
dataset are linked to merged positions.
"""

from __future__ import annotations

import random
from collections import defaultdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from draftsmith.core.atomic import atomic_path

TRAIN, VALIDATION = "train", "validation"
# Rows per row group of the merged table: its readers hold a group at a time (pyarrow's default, 1Mi rows, is
# a user's whole table), and the validation rows, written last, are found by the groups' statistics.
ROW_GROUP_ROWS = 2048
MIN_VALIDATION_PROMPTS = 32


def validation_prompts(prompts: int, fraction: float) -> int:
    """How many prompts are held out: ``fraction`` of them, at least :data:`MIN_VALIDATION_PROMPTS` or a quarter
    of a smaller set (and one, of two or more)."""
    if prompts < 2:
        return 0
    return max(1, round(prompts * fraction), min(MIN_VALIDATION_PROMPTS, prompts // 4))


def split_groups(groups: list[tuple[str, str]], fraction: float, seed: int) -> set[tuple[str, str]]:
    """The validation groups: the last :func:`validation_prompts` of a seeded shuffle."""
    order = sorted(groups)
    random.Random(seed).shuffle(order)
    n_val = validation_prompts(len(order), fraction)
    return set(order[len(order) - n_val:])


def resample(rows: list[int], weight: float, rng: random.Random) -> list[int]:
    whole, part = int(weight), weight - int(weight)
    return rows * whole + rng.sample(rows, round(len(rows) * part))


def merge(tables: dict[str, Path], out: Path, seed: int, validation_fraction: float,
          weights: dict[str, float]) -> dict:
    parts = []
    for name in sorted(tables):
        table = pq.read_table(tables[name])
        parts.append(table.append_column("source_row", pa.array(range(table.num_rows), pa.int64())))
    merged = pa.concat_tables(parts)
    if merged.num_rows == 0:
        raise ValueError("no training rows: every dataset produced zero tokenized records")
    keys = list(zip(merged.column("dataset").to_pylist(), merged.column("prompt_id").to_pylist(), strict=True))
    validation = split_groups(sorted(set(keys)), validation_fraction, seed)
    rng = random.Random(seed)
    train_by_dataset: dict[str, list[int]] = defaultdict(list)
    val_rows = []
    for i, key in enumerate(keys):
        (val_rows if key in validation else train_by_dataset[key[0]]).append(i)
    train_rows = [i for name in sorted(train_by_dataset)
                  for i in resample(train_by_dataset[name], weights.get(name, 1.0), rng)]
    if not train_rows:
        raise ValueError("no training rows left after the validation split and the mixture weights")
    rng.shuffle(train_rows)
    rng.shuffle(val_rows)
    order = train_rows + val_rows
    merged = merged.take(pa.array(order, pa.int64()))
    merged = merged.append_column("split", pa.array([TRAIN] * len(train_rows) + [VALIDATION] * len(val_rows)))
    with atomic_path(out) as tmp:
        pq.write_table(merged, tmp, row_group_size=ROW_GROUP_ROWS)
    return _stats(parts, merged, sorted(tables), weights)


def _stats(parts, merged: pa.Table, names: list[str], weights: dict[str, float]) -> dict:
    per = {}
    rows = merged.select(["dataset", "split", "loss_mask"]).to_pylist()
    for name, part in zip(names, parts, strict=True):
        before = part.column("loss_mask").to_pylist()
        mine = [r for r in rows if r["dataset"] == name]
        per[name] = {
            "weight": weights.get(name, 1.0),
            "rows_before": part.num_rows, "supervised_tokens_before": sum(map(sum, before)),
            "train_rows": sum(r["split"] == TRAIN for r in mine),
            "validation_rows": sum(r["split"] == VALIDATION for r in mine),
            "train_supervised_tokens": sum(sum(r["loss_mask"]) for r in mine if r["split"] == TRAIN),
        }
    n_train = sum(r["split"] == TRAIN for r in rows)
    return {"rows": merged.num_rows, "train_rows": n_train, "validation_rows": merged.num_rows - n_train,
            "datasets": per}


def train_ratio(n_train: int, n_rows: int) -> float:
    """The ratio that makes speculators' ``int(n_rows * ratio)`` land exactly on ``n_train``
    (half a row of margin absorbs floating-point rounding)."""
    return (n_train + 0.5) / n_rows
