"""Datasets that arrive already tokenized: rows with ``input_ids`` and ``loss_mask``.

Accepted: jsonl/json/parquet files, or a folder written by ``datasets.save_to_disk`` (the format
speculators' ``prepare-data`` writes). Each row is checked against the target and the mask, and
a row that fails is a counted reject naming file, row and field, never a silent drop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from draftsmith.data.chat import write_parquet
from draftsmith.data.datasets import Reject, iter_rows, resolve_source


def rows_of(source: str, base_dir: Path):
    path = resolve_source(source, base_dir)
    if path.is_dir():
        from datasets import load_from_disk

        loaded = load_from_disk(str(path))
        loaded = loaded["train"] if hasattr(loaded, "keys") else loaded
        return str(path), enumerate(loaded.with_format(None), start=1)
    return str(path), iter_rows(path)


def check_row(row: Any, vocab_size: int) -> tuple[list[int], list[int]]:
    """``(input_ids, loss_mask)`` of a valid row; raise ``ValueError`` naming the field otherwise."""
    if not isinstance(row, dict):
        raise _Bad("<row>", f"expected an object, got {type(row).__name__}")
    ids, mask = row.get("input_ids"), row.get("loss_mask")
    if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise _Bad("input_ids", "expected a non-empty list of integers")
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise _Bad("input_ids", f"token id {bad} is outside the target's vocabulary (0..{vocab_size - 1})")
    if not isinstance(mask, list) or len(mask) != len(ids):
        raise _Bad("loss_mask", f"expected a list as long as input_ids ({len(ids)}), got "
                                f"{len(mask) if isinstance(mask, list) else type(mask).__name__}")
    if any(m not in (0, 1, True, False) for m in mask):
        raise _Bad("loss_mask", "values must be 0 or 1")
    if not any(mask):
        raise _Bad("loss_mask", "no supervised token")
    return ids, [int(m) for m in mask]


class _Bad(ValueError):
    def __init__(self, field_name: str, reason: str):
        super().__init__(reason)
        self.field_name = field_name


def import_tokenized(cfg: dict, base_dir: Path, dataset: str, vocab_size: int, max_length: int, out: Path
                     ) -> tuple[dict, list[Reject]]:
    """Validate and write a pre-tokenized dataset in the tokenize stage's table layout."""
    file, rows_iter = rows_of(cfg["source"], base_dir)
    rows, rejects = [], []
    for number, row in rows_iter:
        if number <= cfg["skip"]:
            continue
        if cfg["max_samples"] is not None and len(rows) >= cfg["max_samples"]:
            break
        try:
            if isinstance(row, ValueError):
                raise _Bad("<line>", str(row))
            ids, mask = check_row(row, vocab_size)
            if not any(mask[:max_length]):
                raise _Bad("loss_mask", f"no supervised token within tokenize.max_length={max_length}")
        except _Bad as bad:
            rejects.append(Reject(file, number, bad.field_name, str(bad)))
            continue
        raw_id = row.get(cfg["id_field"])
        row_id = str(raw_id) if raw_id not in (None, "") else f"row{number}"
        rows.append({"id": row_id, "prompt_id": row_id, "dataset": dataset, "input_ids": ids[:max_length],
                     "loss_mask": mask[:max_length], "seq_len": min(len(ids), max_length),
                     "truncated_to_max_length": len(ids) > max_length})
    write_parquet(rows, out)
    stats = {"rows": len(rows), "rejected": len(rejects), "tokens": sum(r["seq_len"] for r in rows),
             "assistant_tokens": sum(sum(r["loss_mask"]) for r in rows)}
    return stats, rejects
