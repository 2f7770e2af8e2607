"""Redo one dataset's stage without touching any other dataset's files, then run the workflow.

    ./run.sh redo hidden_states DATASET [snakemake args...]   # extract its hidden states again
    ./run.sh redo answers DATASET [snakemake args...]         # regenerate its answers (and what follows)

The dataset's stored state (hidden-state store, or answer journal and response files) is deleted,
so Snakemake finds those outputs missing and reruns exactly the jobs that depend on them; resume
state alone would otherwise keep every row that still matches.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

STAGES = {
    "hidden_states": lambda d: [Path("results/hidden_states") / d],
    "answers": lambda d: [*Path("results/responses/.journal").glob(f"{d}-*.jsonl"),
                          *Path("results/responses").glob(f"{d}.*")],
}


def remove(stage: str, dataset: str) -> list[Path]:
    if stage not in STAGES:
        raise SystemExit(f"draftsmith redo: unknown stage {stage!r}; use one of {', '.join(STAGES)}")
    paths = [p for p in STAGES[stage](dataset) if p.exists()]
    for path in paths:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    return paths


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        raise SystemExit(__doc__)
    stage, dataset, *snakemake_args = argv
    workdir = next((snakemake_args[i + 1] for i, a in enumerate(snakemake_args[:-1]) if a in ("-d", "--directory")),
                   ".")
    os.chdir(workdir)
    for path in remove(stage, dataset):
        print(f"draftsmith redo: removed {path}", file=sys.stderr)
    os.execv(sys.executable, [sys.executable, "-m", "snakemake", *snakemake_args])


if __name__ == "__main__":
    main(sys.argv[1:])
