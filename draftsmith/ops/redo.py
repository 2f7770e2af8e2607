"""Redo one dataset's stage without touching any other dataset's files, then run the workflow.

    ./run.sh redo hidden_states DATASET [--yes] [snakemake args...]   # extract its hidden states again
    ./run.sh redo answers DATASET [--yes] [snakemake args...]         # regenerate its answers (and what follows)

The dataset's stored state (hidden-state store, or answer journal and response files) is deleted,
so Snakemake finds those outputs missing and reruns exactly the jobs that depend on them; resume
state alone would otherwise keep every row that still matches.

What is deleted was paid for (GPU hours, API money), so: the stage and dataset are checked against
the config before anything happens; with ``-n``/``--dry-run`` nothing is deleted, and the files that
would be are listed with their sizes; deleting work that took longer than :data:`ASK_ABOVE_S` asks
first (``--yes`` answers for scripts; without a terminal and without ``--yes`` it refuses).
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from draftsmith.config.load import WORKFLOW_DIR, ConfigError, from_snakemake_args
from draftsmith.config.snakemake_args import parse as parse_snakemake_args
from draftsmith.core.units import human_bytes
from draftsmith.generation.generate import JOURNAL_DIR, journals_of
from draftsmith.ops import spent

ASK_ABOVE_S = 300.0
LOG = {"hidden_states": "logs/hidden_states/{}.log", "answers": "logs/generate/{}.log"}  # the jobs' ledgers
STAGES = {
    "hidden_states": lambda d: [Path("results/hidden_states") / d],
    "answers": lambda d: [*journals_of(JOURNAL_DIR, d), *Path("results/responses").glob(f"{d}.*")],
}
OUTPUT = {"hidden_states": "results/hidden_states/{}/manifest.json", "answers": "results/responses/{}.jsonl"}


class RedoRefused(SystemExit):
    def __init__(self, message: str):
        super().__init__(f"draftsmith redo: {message}")


@dataclass
class Plan:
    """What a redo deletes, and what it cost to make."""

    paths: list[Path]
    bytes: int
    seconds: float | None  # every job's wall time (draftsmith.ops.spent); None when none ended

    def describe(self) -> str:
        took = f", made in {self.seconds / 60:.1f} min" if self.seconds is not None else ""
        return f"{len(self.paths)} path(s), {human_bytes(self.bytes)}{took}"


def size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def plan(stage: str, dataset: str) -> Plan:
    """The stage's files, and what every job that made them cost (their ledger goes with them)."""
    log = LOG[stage].format(dataset)
    paths = [p for p in [*STAGES[stage](dataset), spent.ledger(log)] if p.exists()]
    return Plan(paths, sum(map(size, paths)), spent.total(log))


def datasets_of(snakemake_args: list[str], workflow_dir: Path) -> list[str]:
    """Dataset names of the config this run would use."""
    try:
        return sorted(from_snakemake_args(snakemake_args, workflow_dir)["datasets"])
    except ConfigError as err:
        raise RedoRefused(str(err)) from None


def check(stage: str, dataset: str, datasets: list[str]) -> None:
    if stage not in STAGES:
        raise RedoRefused(f"unknown stage {stage!r}; use one of {', '.join(STAGES)}")
    if dataset not in datasets:
        raise RedoRefused(f"unknown dataset {dataset!r}; the config has {', '.join(datasets)}")


def confirm(stage: str, dataset: str, what: Plan, yes: bool) -> None:
    if yes or not what.paths or (what.seconds is not None and what.seconds < ASK_ABOVE_S):
        return
    question = f"draftsmith redo: delete {dataset}'s {stage} ({what.describe()})? [y/N] "
    if not sys.stdin.isatty():
        raise RedoRefused(f"{dataset}'s {stage} ({what.describe()}) would be deleted; add --yes to confirm")
    if input(question).strip().lower() not in ("y", "yes"):
        raise RedoRefused("nothing deleted")


def main(argv: list[str], workflow_dir: Path = WORKFLOW_DIR) -> None:
    if len(argv) < 2:
        raise SystemExit(__doc__)
    stage, dataset, *rest = argv
    yes = "--yes" in rest
    snakemake_args = [a for a in rest if a != "--yes"]
    parsed = parse_snakemake_args(snakemake_args)
    datasets = datasets_of(snakemake_args, workflow_dir)
    check(stage, dataset, datasets)
    os.chdir(parsed.directory or ".")
    what = plan(stage, dataset)
    if parsed.dry_run:
        for path in what.paths:
            print(f"draftsmith redo: would remove {path} ({human_bytes(size(path))})", file=sys.stderr)
        print(f"draftsmith redo: dry run, nothing deleted ({what.describe()} would be)", file=sys.stderr)
        snakemake_args += ["--forcerun", OUTPUT[stage].format(dataset)]  # show the jobs the redo would run
    else:
        confirm(stage, dataset, what, yes)
        for path in what.paths:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
            print(f"draftsmith redo: removed {path}", file=sys.stderr)
    os.execv(sys.executable, [sys.executable, "-m", "snakemake", *snakemake_args])


if __name__ == "__main__":
    main(sys.argv[1:])
