"""Merge per-dataset token tables into one seeded-shuffle training set with a validation tail.

speculators' trainer splits by position (the first ``train_ratio`` of rows train, the rest
validate), so the shuffle decides the split. The merged table keeps each row's dataset and row
number so that hidden states extracted per dataset can be linked to merged positions.
"""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from draftsmith.atomic import atomic_path


def merge(tables: dict[str, Path], out: Path, seed: int) -> dict:
    parts = []
    for name in sorted(tables):
        table = pq.read_table(tables[name])
        parts.append(table.append_column("source_row", pa.array(range(table.num_rows), pa.int64())))
    merged = pa.concat_tables(parts)
    if merged.num_rows == 0:
        raise ValueError("no training rows: every dataset produced zero tokenized records")
    order = list(range(merged.num_rows))
    random.Random(seed).shuffle(order)
    merged = merged.take(pa.array(order))
    with atomic_path(out) as tmp:
        pq.write_table(merged, tmp)
    return {"rows": merged.num_rows,
            "rows_by_dataset": {name: part.num_rows for name, part in zip(sorted(tables), parts, strict=True)}}
