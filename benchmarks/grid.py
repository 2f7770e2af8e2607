"""The serving grid of a finished run, side by side: every cell's τ, tokens per target step and speed-up
against the target alone measured in the same window, the best cell per concurrency and its margin, and
what the grid cost against the training it measures.

    ./run.sh --configfile config/config.yaml benchmarks/grid.yaml
    .venv/bin/python benchmarks/grid.py WORKDIR
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from draftsmith.evaluation.decide.pick import figures, label_of
from draftsmith.evaluation.measure.methods import DISPLAY_NAME


def seconds(timing: Path) -> float | None:
    if not timing.exists():
        return None
    with timing.open() as fh:
        return float(next(csv.DictReader(fh, delimiter="\t"))["s"])


def cell_name(cell: dict | None) -> str:
    return f"{DISPLAY_NAME[cell['method']]} k={cell['k']} ({cell['speedup']:.2f}x)" if cell else "–"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workdir", type=Path)
    args = parser.parse_args()
    results = json.loads((args.workdir / "results" / "evaluation" / "results.json").read_text())
    print("| method | k | concurrency | τ per draft | tokens / step | speed-up (geo. mean) | per set and T |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for method, evaluation in results["methods"].items():
        for cell in evaluation.get("cells", []):
            if cell["drafter"] != label_of(evaluation):
                continue
            f = figures(cell)
            runs = "; ".join(f"{r['set']} T={r['temperature']:g}: τ {r['acceptance']['tau_pooled'] or 0:.3f}, "
                             f"{r['speedup'] or 0:.2f}x" for r in cell["runs"])
            print(f"| {DISPLAY_NAME[method]} | {cell['k']} | {cell['concurrency']} | {f['tau'] or 0:.3f} | "
                  f"{f['tokens_per_step'] or 0:.3f} | {f['speedup'] or 0:.2f}x | {runs} |")
    print("\n| concurrency | best | margin over the next method | best trained | best training-free | "
          "training bought (tokens / step) |\n|---:|---|---|---|---|---:|")
    for entry in results["serving"]:
        runner, bought = entry.get("runner_up"), entry.get("training_bought")
        margin = f"{entry['margin']:+.1%} over {cell_name(runner)}" if runner else "–"
        print(f"| {entry['concurrency']} | {cell_name(entry['best'])} | {margin} | "
              f"{cell_name(entry['best_trained'])} | {cell_name(entry['best_training_free'])} | "
              f"{'–' if bought is None else f'{bought:+.1%}'} |")
    print(f"\npicked: {results['pick']['family']} at concurrency {results['pick']['at']}, k={results['pick']['k']}: "
          f"{results['pick']['why']}")
    timings = args.workdir / "results" / "timings"
    print("\n| job | seconds | cells | server starts | seconds per cell (with its share of the baseline) |\n"
          "|---|---:|---:|---:|---:|")
    for method, evaluation in results["methods"].items():
        spent, cells = seconds(timings / f"evaluate_{method}.tsv"), len(evaluation.get("cells", []))
        starts = evaluation.get("server_start_s", [])
        per_cell = f"{spent / cells:.0f}" if spent and cells else "–"
        print(f"| evaluate {method} | {spent or 0:.0f} | {cells} | {len(starts)} ({sum(starts):.0f} s) | {per_cell} |")
    for family in (r["family"] for r in results["families"]):
        print(f"| train {family} | {seconds(timings / f'train_{family}.tsv') or 0:.0f} | | | |")


if __name__ == "__main__":
    main()
