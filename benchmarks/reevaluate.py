"""τ of finished drafters measured again, on more prompts and several times: evaluation noise apart
from training noise.

``recipes.py`` measures each drafter once, on 12 prompts × 64 tokens per set. At T > 0 on a CPU
server that sample is unseeded (vLLM-CPU cannot seed a chunked prefill, see
``draftsmith.evaluation.measure.evaluate.sampling``), so one drafter's τ on a set moves from one measurement
to the next, and a gap between two recipes may be the sample's, not the drafters'. This serves each
given run's drafter once more (the run's own target and server settings) and measures τ on chosen
evaluation sets, widened, ``--repeats`` times per temperature; it prints and writes τ per run, set,
temperature and repeat, with the mean and the spread over repeats.

    .venv/bin/python benchmarks/reevaluate.py --config benchmarks/recipes_1k.yaml \\
        --sets humaneval --skip 0 --max-samples 164 --max-tokens 128 --temperatures 0 1 --repeats 3 --concurrency 32 \\
        WORKDIR/runs/bf16-seed2 WORKDIR/runs/fp8-seed2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from draftsmith.config.load import EMBEDDED, WORKFLOW_DIR, load_layers, validate_config  # noqa: E402
from draftsmith.config.target import resolve  # noqa: E402
from draftsmith.core import compute  # noqa: E402
from draftsmith.evaluation.measure import evaluate as ev  # noqa: E402
from draftsmith.generation.server import managed_server  # noqa: E402


def widened(evaluation: dict, sets: list[str], skip: int | None, max_samples: int | None) -> dict:
    """The evaluation slice with only ``sets``, each with the given skip and sample count."""
    unknown = sorted(set(sets) - set(evaluation["prompt_sets"]))
    if unknown:
        raise SystemExit(f"reevaluate: no evaluation set {unknown}; the config has {sorted(evaluation['prompt_sets'])}")
    chosen = {}
    for name in sets:
        entry = dict(evaluation["prompt_sets"][name])
        if skip is not None:
            entry["skip"] = skip
        if max_samples is not None:
            entry["max_samples"] = max_samples
        chosen[name] = entry
    return {**evaluation, "prompt_sets": chosen}


def measure_run(run: Path, config: dict, evaluation: dict, temperatures: list[float], repeats: int,
                max_tokens: int) -> list[dict]:
    """One server with ``run``'s drafter; every set × temperature measured ``repeats`` times."""
    os.chdir(run)  # the run's relative paths: its prepared target under results/models
    target = resolve(config["target"], REPO)
    sets = ev.prompt_sets(evaluation, REPO)
    drafter = str(run / "results" / "drafter")
    family, k = ev.drafted_per_step(drafter, picked_length(run))
    spec = ev.server_spec("vllm", target, config["server"], family, k, drafter)
    rows = []
    with managed_server(spec, run / "logs" / "reevaluate.server.log") as server:
        ev.warm_up(server.base_url, target.model, sets, max_tokens)
        for name, prompts in sets.items():
            for t in temperatures:
                for repeat in range(repeats):
                    sampling = ev.sampling(max_tokens, t, compute.has_accelerator())  # as the evaluation seeds
                    measured = ev.measure(server.base_url, target.model, prompts, sampling,
                                          evaluation["concurrency"][0], "vllm")
                    rows.append({"run": run.name, "set": name, "prompts": len(prompts), "temperature": t,
                                 "repeat": repeat, "tau": measured["acceptance"]["tau_pooled"],
                                 "output_tokens": measured["output_tokens"]})
                    print(f"{run.name} {name} T={t:g} #{repeat}: τ {rows[-1]['tau']:.3f} "
                          f"({measured['output_tokens']} tokens)", flush=True)
    return rows


def picked_length(run: Path) -> int:
    """The draft length the run's pick chose (its drafter's best at evaluation.pick_at), not the first listed."""
    return json.loads((run / "results" / "evaluation" / "results.json").read_text())["pick"]["k"]


def table(rows: list[dict]) -> list[str]:
    lines = ["| run | set | prompts | T | τ per repeat | mean | ± |", "|---|---|---:|---:|---|---:|---:|"]
    keys = dict.fromkeys((r["run"], r["set"], r["prompts"], r["temperature"]) for r in rows)
    for run, name, prompts, t in keys:
        taus = [r["tau"] for r in rows if (r["run"], r["set"], r["temperature"]) == (run, name, t)]
        lines.append(f"| {run} | {name} | {prompts} | {t:g} | {', '.join(f'{x:.3f}' for x in taus)} | "
                     f"{statistics.fmean(taus):.3f} | {(max(taus) - min(taus)) / 2:.3f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders of recipes.py (WORKDIR/runs/NAME)")
    parser.add_argument("--config", type=Path, required=True, help="the config the runs were made with")
    parser.add_argument("--sets", nargs="+", required=True, help="evaluation sets of that config")
    parser.add_argument("--skip", type=int, help="rows of each set skipped (default: the config's)")
    parser.add_argument("--max-samples", type=int, help="prompts per set (default: the config's)")
    parser.add_argument("--max-tokens", type=int, help="tokens per answer (default: the config's)")
    parser.add_argument("--temperatures", nargs="+", type=float, default=[1.0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int,
                        help="requests in flight (default: the config's; speed only, not τ)")
    parser.add_argument("--out", type=Path, help="where the rows go as JSON (default: beside the first run)")
    args = parser.parse_args()
    # recipe configs are laid over the CPU demo, as recipes.py lays them
    config = validate_config(load_layers([WORKFLOW_DIR / EMBEDDED, args.config.resolve()], {}))
    evaluation = widened(config["evaluation"], args.sets, args.skip, args.max_samples)
    evaluation["concurrency"] = [args.concurrency] if args.concurrency else evaluation["concurrency"]
    max_tokens = args.max_tokens or evaluation["max_tokens"]
    runs = [r.resolve() for r in args.runs]
    out = (args.out or runs[0].parent / "reevaluate.json").resolve()  # before measure_run enters each run's folder
    rows = [row for run in runs for row in measure_run(run, config, evaluation, args.temperatures, args.repeats,
                                                       max_tokens)]
    out.write_text(json.dumps(rows, indent=1))
    print("\n".join(table(rows)))
    print(f"rows: {out}")


if __name__ == "__main__":
    main()
