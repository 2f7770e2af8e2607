"""What a job's outputs cost: the wall time of every job that worked on them, resumed runs included.

Snakemake's ``benchmark:`` file holds only the last job's time, so a generation resumed five times
looked as cheap as its last short run. Each job run through :func:`draftsmith.ops.runner.run` appends its
wall time to a ledger beside its timings (``results/timings/spent/<the log's path>.jsonl``) when it
ends, failed or stopped included; a job killed with -9 cannot, so the total is a lower bound.
"""

from __future__ import annotations

from pathlib import Path

from draftsmith.core import jsonl

LEDGERS = Path("results/timings/spent")


def ledger(log_path: str | Path) -> Path:
    """The ledger of the job that logs to ``log_path`` (``logs/generate/x.log``)."""
    relative = Path(log_path).relative_to("logs") if Path(log_path).is_relative_to("logs") else Path(log_path).name
    return LEDGERS / Path(relative).with_suffix(".jsonl")


def add(log_path: str | Path, seconds: float) -> None:
    jsonl.append(ledger(log_path), [{"seconds": round(seconds, 1)}])


def total(log_path: str | Path) -> float | None:
    """Seconds spent by every job so far, or None when none ended."""
    seconds = [r["seconds"] for r in jsonl.read_appended(ledger(log_path))]
    return sum(seconds) if seconds else None
