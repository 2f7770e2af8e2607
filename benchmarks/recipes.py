"""Drafter recipes side by side at a fixed data budget, on your own data.

One config (your datasets, evaluation sets, target) and a list of recipes, each a set of ``train:``
overrides. The data stages (generation, tokenization, merge and split, hidden states, vocabulary) run
once in ``WORKDIR/shared``; every recipe × seed trains, exports and is evaluated (against the target
alone measured in the same window) in its own folder that links to those results, so only training
differs; a run that would redo any shared result (and so write into the shared folder) is refused
before it starts. Every recipe gets the same epochs, data and seeds. A recipe × seed already
evaluated is picked up, not rerun: a long comparison can be run one recipe at a time (``--only``),
over several sittings or machines sharing WORKDIR.

A recipe may also change how hidden states are stored (``hidden_states: {storage: fp8}`` beside its
train overrides): that storage's hidden states are extracted once, in ``WORKDIR/shared-<storage>``
(linked to the shared answers, tokens and split), and every seed of the recipe trains on them.

Printed and written to ``WORKDIR/recipes.md`` (+ ``recipes.png``): τ per evaluation set at each
temperature (pooled, from vLLM, at the picked draft length and ``evaluation.pick_at``; mean and spread
over seeds), the ratio to the first recipe (by
default speculators' own recipe), simulated τ from validation, acceptance per draft position,
training time, the engines that can serve each recipe, and time to quality: the epoch (and training
wall time) at which a recipe's simulated τ first reached the first recipe's final one.

    .venv/bin/python benchmarks/recipes.py --config my.yaml --workdir /scratch/recipes [--seeds 0 1]
        [--recipes recipes.yaml] [--only NAME]
"""

from __future__ import annotations

import argparse
import base64
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from draftsmith.evaluation.decide import pick  # noqa: E402
from draftsmith.training.export import sglang_refusal  # noqa: E402
from draftsmith.training.train import simulated_tau  # noqa: E402

# speculators' own recipe first: every ratio is against it.
DEFAULT_RECIPES = {
    "speculators": {},
    "fc_norm": {"fc_norm": True},
    "lk_hybrid": {"loss_fn": "lk_hybrid"},
    "qwen3_layer": {"draft_arch": "qwen3"},
    "ttt7_decay0.8": {"ttt_steps": 7, "ttt_step_loss_decay": 0.8},
    "lm_head_trained": {"train_lm_head": True},
}
# What every recipe reads from the shared run. Not the engine check the pick reads: a recipe's drafter shape is
# its own (rule engine_check reuses the preflight's verdict where the shape is the same, in the run's folder).
SHARED = ("results/models", "results/checks/preflight.json", "results/prompts", "results/responses",
          "results/tokenized", "results/merged", "results/hidden_states", "results/vocab")


EMBEDDED = REPO / "config" / "config.yaml"  # the recipe configs change the CPU demo: laid over it


def snakemake_command(work: Path, configs: list[Path], *targets: str) -> list[str]:
    # targets before --configfile, which takes every argument after it
    return [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(work), "--cores",
            str(os.cpu_count()), *targets, "--configfile", str(EMBEDDED), *map(str, configs)]


def snakemake(work: Path, configs: list[Path], *targets: str, dry_run: bool = False) -> str:
    proc = subprocess.run(snakemake_command(work, configs, *targets) + (["--dry-run"] if dry_run else []),
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"recipes: snakemake failed in {work}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout


def planned_outputs(dry_run_output: str) -> list[str]:
    """The output files of every job a Snakemake dry run lists."""
    return [path for line in dry_run_output.splitlines() if line.strip().startswith("output: ")
            for path in line.strip().removeprefix("output: ").split(", ")]


def refuse_shared_reruns(run: Path, planned: list[str]) -> None:
    """A recipe's run reaches the shared results through links: a job it would rerun there (stale
    metadata, an input re-synced with a new mtime, a job killed half-way) would overwrite or delete
    the data every other recipe was trained on."""
    shared = sorted({p for p in planned if p.startswith(SHARED)})
    if shared:
        raise SystemExit(f"recipes: {run} would redo shared results ({', '.join(shared[:4])}"
                         f"{', …' if len(shared) > 4 else ''}) and write them into the shared folder; nothing "
                         f"was run. Delete {run} to start this recipe × seed afresh from the shared results.")


def prepare_shared(workdir: Path, config: Path) -> Path:
    shared = workdir / "shared"
    snakemake(shared, [config], "results/vocab/d2t.npy", *[
        f"results/hidden_states/{d}/manifest.json" for d in datasets_of(config)])
    return shared


def datasets_of(config: Path) -> list[str]:
    from draftsmith.config.load import from_snakemake_args

    return sorted(from_snakemake_args(["--configfile", str(EMBEDDED), str(config)], REPO)["datasets"])


def link_shared(folder: Path, shared: Path, paths: tuple[str, ...]) -> None:
    """``folder`` reads ``paths`` of ``shared`` through links (it never writes there), with Snakemake's
    record of those jobs refreshed at every start, so that it reruns none of them."""
    (folder / "results").mkdir(parents=True, exist_ok=True)
    for rel in paths:
        link = folder / rel
        if not link.exists():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(shared / rel)
    copy_records(shared, folder, paths)


def copy_records(shared: Path, folder: Path, paths: tuple[str, ...]) -> None:
    """Snakemake's records (``.snakemake/metadata``: a file per output, named by its path in base64,
    split into folders of ``@``-prefixed parts when long) of the outputs under ``paths`` only: a folder
    that makes some outputs itself (``shared-fp8``'s hidden states) keeps its own records of them,
    which the shared ones (other params) would replace, and the job would run again."""
    source = shared / ".snakemake" / "metadata"
    for record in source.rglob("*") if source.is_dir() else []:
        if record.is_dir():
            continue
        rel = record.relative_to(source)
        output = base64.urlsafe_b64decode("".join(p.removeprefix("@") for p in rel.parts)).decode()
        if output.startswith(paths):
            (folder / ".snakemake" / "metadata" / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(record, folder / ".snakemake" / "metadata" / rel)


def prepare_storage(workdir: Path, shared: Path, config: Path, storage: dict) -> Path:
    """A shared folder whose hidden states are stored as ``storage`` says, everything else linked."""
    folder = workdir / ("shared-" + "-".join(f"{v}" for _, v in sorted(storage.items())))
    link_shared(folder, shared, tuple(p for p in SHARED if p != "results/hidden_states"))
    overlay = folder / "storage.yaml"
    overlay.write_text(yaml.safe_dump({"hidden_states": storage}))
    targets = [f"results/hidden_states/{d}/manifest.json" for d in datasets_of(config)]
    refuse_shared_reruns(folder, [p for p in planned_outputs(snakemake(folder, [config, overlay], *targets,
                                                                       dry_run=True))
                                  if not p.startswith("results/hidden_states")])
    snakemake(folder, [config, overlay], *targets)
    return folder


def run_recipe(workdir: Path, shared: Path, config: Path, name: str, overrides: dict, seed: int) -> Path:
    run = workdir / "runs" / f"{name}-seed{seed}"
    overrides = dict(overrides)
    storage = overrides.pop("hidden_states", None)
    if storage:
        shared = prepare_storage(workdir, shared, config, storage)
    link_shared(run, shared, SHARED)
    overlay = run / "recipe.yaml"
    overlay.write_text(yaml.safe_dump({"train": {**overrides, "seed": seed}, **({"hidden_states": storage}
                                                                               if storage else {})}))
    target = "results/evaluation/results.json"
    if not (run / target).exists():
        refuse_shared_reruns(run, planned_outputs(snakemake(run, [config, overlay], target, dry_run=True)))
        snakemake(run, [config, overlay], target)
    return run


def summarise(run: Path) -> dict:
    results = json.loads((run / "results/evaluation/results.json").read_text())
    family = results["family"]  # the picked one (the only one, unless the recipe lists several)
    training = json.loads((run / f"results/train/{family}/training.json").read_text())
    with (run / f"results/timings/train_{family}.tsv").open() as fh:
        seconds = float(next(csv.DictReader(fh, delimiter="\t"))["s"])
    taus = {(r["set"], r["temperature"]): r["acceptance"] for r in results["runs"]}  # the picked cell's
    validation = training["validation"]
    epoch_s = [e.get("train_s") for e in validation]
    if None in epoch_s:  # trained before per-epoch times were recorded: the job's time shared out evenly
        epoch_s = [seconds * (i + 1) / len(validation) for i in range(len(validation))]
    return {"tau": {k: v["tau_pooled"] for k, v in taus.items()},
            "per_position": {k: v["acceptance_rate_per_position"] for k, v in taus.items()},
            "simulated": [simulated_tau(e) for e in validation], "epoch_s": epoch_s, "train_s": seconds,
            "served_by": "vLLM" if sglang_refusal(json.loads((run / "results/drafter/config.json").read_text()))
            else "vLLM, SGLang", "family": family, "speedup": pick.score(results["runs"], "speedup"),
            "drafter_mib": (run / "results/drafter/final.safetensors").stat().st_size / 2**20}


def pooled(summary: dict, temperature: float) -> float:
    values = [v for (_, t), v in summary["tau"].items() if t == temperature and v is not None]
    return statistics.fmean(values) if values else float("nan")


def mean_curve(runs: list[dict], key: str) -> list[float]:
    """A per-epoch series (simulated τ, training time) averaged over seeds (the reference then
    reaches its own final τ)."""
    return [statistics.fmean(epochs) for epochs in zip(*(s[key] for s in runs), strict=True)]


def time_to_quality(simulated: list[float], target: float, epoch_s: list[float]) -> str:
    """The first epoch whose simulated τ reaches ``target``, with the training time up to it."""
    for epoch, tau in enumerate(simulated):
        if tau >= target:
            return f"epoch {epoch + 1} ({epoch_s[epoch]:.0f} s)"
    return "not reached"


def table(summaries: dict[str, list[dict]]) -> list[str]:
    first = next(iter(summaries))
    keys = sorted({k for runs in summaries.values() for s in runs for k in s["tau"]})
    ref_sim = statistics.fmean(s["simulated"][-1] for s in summaries[first])
    head = " | ".join(f"{s} T={t:g}" for s, t in keys)
    lines = [f"| recipe | seeds | {head} | τ T=0 ratio | τ T=1 ratio | simulated τ | per position (T=0, first set) | "
             "train s | ratio | time to reference τ | served by | speed-up (geometric mean) | drafter MiB |",
             "|---|---:|" + "---:|" * len(keys) + "---:|---:|---:|---|---:|---:|---|---|---:|---:|"]
    for name, runs in summaries.items():
        cells = []
        for k in keys:
            values = [s["tau"][k] for s in runs]
            spread = f" ± {(max(values) - min(values)) / 2:.3f}" if len(values) > 1 else ""
            cells.append(f"{statistics.fmean(values):.3f}{spread}")
        ratio = {t: statistics.fmean(pooled(s, t) for s in runs) / statistics.fmean(
            pooled(s, t) for s in summaries[first]) for t in {t for _, t in keys}}
        train_s = statistics.fmean(s["train_s"] for s in runs)
        ref_s = statistics.fmean(s["train_s"] for s in summaries[first])
        per_pos = ", ".join(f"{v:.2f}" for v in runs[0]["per_position"][keys[0]])
        lines.append(f"| {name} | {len(runs)} | {' | '.join(cells)} | {ratio.get(0.0, float('nan')):.3f} | "
                     f"{ratio.get(1.0, float('nan')):.3f} | {statistics.fmean(s['simulated'][-1] for s in runs):.3f} | "
                     f"{per_pos} | {train_s:.0f} | {train_s / ref_s:.2f} | "
                     f"{time_to_quality(mean_curve(runs, 'simulated'), ref_sim, mean_curve(runs, 'epoch_s'))} | "
                     f"{runs[0]['served_by']} | {_mean_spread([s.get('speedup') for s in runs])} | "
                     f"{_mean_spread([s.get('drafter_mib') for s in runs], '.1f')} |")
    return lines


def _mean_spread(values: list[float | None], spec: str = ".3f") -> str:
    """Mean ± half the range over seeds; – where a run has no figure (recorded before it was kept)."""
    if not values or None in values:
        return "–"
    spread = f" ± {(max(values) - min(values)) / 2:{spec}}" if len(values) > 1 else ""
    return f"{statistics.fmean(values):{spec}}{spread}"


def plot(summaries: dict[str, list[dict]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for i, t in enumerate((0.0, 1.0)):
        means = [statistics.fmean(pooled(s, t) for s in runs) for runs in summaries.values()]
        spreads = [(max(pooled(s, t) for s in runs) - min(pooled(s, t) for s in runs)) / 2
                   for runs in summaries.values()]
        ax.bar([x + 0.4 * i for x in range(len(means))], means, 0.4, yerr=spreads, label=f"T={t:g}")
    ax.set_xticks([x + 0.2 for x in range(len(summaries))], list(summaries), rotation=20)
    ax.set_ylabel("τ (pooled, mean over sets)")
    ax.set_ylim(bottom=1.0)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=REPO / "config" / "config.yaml")
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--recipes", type=Path, help="YAML mapping of recipe name to train overrides")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--only", help="run this recipe only (others already finished are still reported)")
    args = parser.parse_args()
    recipes = yaml.safe_load(args.recipes.read_text()) if args.recipes else DEFAULT_RECIPES
    config = args.config.resolve()
    shared = prepare_shared(args.workdir, config)
    summaries: dict[str, list[dict]] = {}
    for name, overrides in recipes.items():
        for seed in args.seeds:
            run = args.workdir / "runs" / f"{name}-seed{seed}"
            if args.only in (None, name):
                run = run_recipe(args.workdir, shared, config, name, overrides or {}, seed)
            if (run / "results/evaluation/results.json").exists():
                summaries.setdefault(name, []).append(summarise(run))
            print(f"recipes: {name} seed {seed}: {'done' if name in summaries else 'not run yet'}", file=sys.stderr)
    if next(iter(recipes)) not in summaries:
        raise SystemExit(f"recipes: the reference recipe {next(iter(recipes))!r} has not run yet")
    lines = ["# Recipes at a fixed data budget", "", *table(summaries)]
    (args.workdir / "recipes.md").write_text("\n".join(lines) + "\n")
    plot(summaries, args.workdir / "recipes.png")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
