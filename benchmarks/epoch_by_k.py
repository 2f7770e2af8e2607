"""Which epoch each draft length chooses: a finished run's epoch checkpoints replayed at the given k's.

The checkpoint is chosen by the predicted served τ at the draft length the pick serves (the largest of
``evaluation.num_speculative_tokens``). Before issue 51 each epoch was walked at ``train.ttt_steps``: with
SpecForge's recipe (7 steps, here 5) served at [1, 3], on an objective nobody serves. This replays every epoch
of a finished run (``results/train/<family>/training.json``) at each k, as the training job does, and prints
the figure and the epoch each k chooses, side by side.

    .venv/bin/python benchmarks/epoch_by_k.py W --ks 1 3 5 --configfile config/config.yaml benchmarks/recipes_300.yaml
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftsmith.config.load import load_layers, validate_config
from draftsmith.core import compute
from draftsmith.generation.generate import answer_sampling, model_sampling
from draftsmith.training import replay
from draftsmith.training.train import epoch_checkpoints, served_figure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--family", default="eagle3")
    parser.add_argument("--ks", type=int, nargs="+", required=True)
    parser.add_argument("--configfile", type=Path, nargs="+", required=True, help="the run's (its answers' sampling)")
    args = parser.parse_args()
    results = args.workdir / "results"
    summary = json.loads((results / "train" / args.family / "training.json").read_text())
    config = validate_config(load_layers(args.configfile, {}))
    (target,) = [p for p in (results / "models").iterdir() if p.is_dir()]
    stores, failed = replay.open_stores(sorted((results / "hidden_states").glob("*/manifest.json")))
    validation = [{"epoch": e["epoch"]} for e in summary["validation"]]
    replay.predict_epochs(validation, epoch_checkpoints(args.workdir / Path(summary["checkpoint"]).parent),
                          results / "merged" / "train.parquet", stores, failed, target, sorted(args.ks),
                          compute.device(), answer_sampling(config["datasets"], model_sampling(str(target))))
    print("| epoch | " + " | ".join(f"k={k}" for k in args.ks) + " |")
    print("|---:|" + "---:|" * len(args.ks))
    best = {}
    for entry in validation:
        by_k = entry["predicted_served"]["by_k"]
        figures = [served_figure(by_k[str(k)]) for k in args.ks]
        print(f"| {entry['epoch'] + 1} | " + " | ".join(f"{f:.3f}" for f in figures) + " |")
        for k, figure in zip(args.ks, figures, strict=True):
            if figure > best.get(k, (0.0, None))[0]:
                best[k] = (figure, entry["epoch"] + 1)
    print("chosen: " + ", ".join(f"k={k} epoch {best[k][1]}" for k in args.ks)
          + f"; the run exported epoch {summary['chosen']['epoch'] + 1}")


if __name__ == "__main__":
    main()
