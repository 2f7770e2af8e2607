"""Hidden-state storage and extraction, measured against their limits, side by side.

On the rows of a finished workflow run (``--workdir``, default: a run of ``tests/e2e/config.yaml``):

1. bytes per token of each layout against the bf16 limit ``(3 aux + 1) x H x 2``, and file counts;
2. write and read tokens/s of each layout (reading through the trainer's own ``ShardTransfer``,
   in merged order);
3. extraction tokens/s of the transformers backend against a bare forward pass of the same model
   over the same tokens (the limit of that stage on this machine), and of the vLLM backend (the
   timing of the workflow's own hidden_states jobs);
4. with ``--train``: speculators training tokens/s (median step) reading each layout, beside
   speculators' own per-row ``FileTransfer``.

    .venv/bin/python benchmarks/hidden_states_layouts.py --workdir /path/to/run [--train]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from draftsmith.hidden_states.extract import extract_transformers, read_rows  # noqa: E402
from draftsmith.hidden_states.store import ShardTransfer, open_store, write_locations  # noqa: E402


def source_store(workdir: Path, dataset: str):
    folder = workdir / "results" / "hidden_states" / dataset
    manifest = json.loads((folder / "manifest.json").read_text())
    return open_store(folder, manifest["fingerprint"], manifest["layout"]), manifest


def copy_into(layout: str, rows: dict, dest: Path, fingerprint: str) -> tuple[float, dict]:
    store = open_store(dest, fingerprint, layout, shard_mb=256)
    started = time.perf_counter()
    with store.writer() as writer:
        for row, data in rows.items():
            writer.write(row, data["hidden_states"], data["token_ids"])
    os.sync()
    return time.perf_counter() - started, store.describe()


def read_all(store, order: list[int], tmp: Path) -> float:
    data_dir = tmp / f"read-{store.layout}"
    data_dir.mkdir()
    write_locations(data_dir, store.locations(order))
    transfer = ShardTransfer(data_dir)
    started = time.perf_counter()
    for i in range(len(order)):
        transfer.get_cached(i)
    return time.perf_counter() - started


def bare_forward(model_dir: str, rows: list[list[int]]) -> float:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    started = time.perf_counter()
    with torch.inference_mode():
        for ids in rows:
            model.model(input_ids=torch.tensor([ids]))
    return time.perf_counter() - started


def train_speeds(workdir: Path, tmp: Path, threads: int) -> None:
    """One epoch of the workflow's own training run, reading per_row copies vs the shards."""
    summary = json.loads((workdir / "results" / "train" / "training.json").read_text())
    argv = list(summary["speculators_argv"])
    data = workdir / argv[argv.index("--data-path") + 1]
    locations = json.loads((data / "hs_locations.json").read_text())
    per_row_dir = tmp / "per_row_all"
    stores: dict = {}
    relocated = []
    for rel, prefix in locations:
        shard = (data / rel).resolve()
        dataset = shard.parents[1].name
        if dataset not in stores:
            source, manifest = source_store(workdir, dataset)
            stores[dataset] = (source, open_store(per_row_dir / dataset, manifest["fingerprint"], "per_row"))
            with stores[dataset][1].writer() as writer:
                for row in range(manifest["rows"]):
                    states = source.read(row)
                    writer.write(row, states["hidden_states"], states["token_ids"])
        row = int(prefix.rstrip("."))
        relocated.append(stores[dataset][1].locations([row])[0])
    print(f"\n{'training reads':<44} {'median step tok/s':>18} {'median fetch ms':>16}")
    for layout in ("draftsmith, shards", "draftsmith, per_row", "speculators' FileTransfer, per-row files"):
        data_dir = tmp / f"train-{layout.split(',')[1].strip()}-{layout[:4]}"
        shutil.copytree(data, data_dir)
        run = list(argv)
        if layout.endswith("shards"):
            write_locations(data_dir, [(str((data / rel).resolve()), prefix) for rel, prefix in locations])
        elif layout.endswith("per_row"):
            write_locations(data_dir, relocated)
        else:  # speculators' own reader: hs_<i>.safetensors in the data folder, backend "file"
            (data_dir / "hidden_states").mkdir()
            for i, (path, _) in enumerate(relocated):
                os.link(path, data_dir / "hidden_states" / f"hs_{i}.safetensors")
            run[run.index("--hidden-states-backend") + 1] = "file"
        for flag, value in (("--data-path", str(data_dir)), ("--save-path", str(data_dir / "ckpt")),
                            ("--log-dir", str(data_dir / "logs")), ("--epochs", "1")):
            run[run.index(flag) + 1] = value
        proc = subprocess.run([sys.executable, "-m", "draftsmith.training.train", str(data_dir / "v.jsonl"), *run],
                              cwd=workdir, capture_output=True, text=True, env={**os.environ,
                                                                                 "OMP_NUM_THREADS": str(threads)})
        if proc.returncode != 0:
            raise SystemExit(f"{layout}: training failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        output = proc.stdout + proc.stderr
        speeds = [float(x) for x in re.findall(r"tokens_per_s(?:': |=)([0-9.]+)", output)][1:]
        if not speeds:
            raise SystemExit(f"{layout}: no tokens_per_s in the trainer's output:\n{output[-3000:]}")
        fetch = [float(x) for x in re.findall(r"fetch_ms(?:': |=)([0-9.]+)", output)][1:]
        print(f"{layout:<44} {statistics.median(speeds):>18,.0f} {statistics.median(fetch):>16.1f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--dataset", default="everyday")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--train", action="store_true", help="also train one epoch reading each layout")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    source, manifest = source_store(args.workdir, args.dataset)
    table_rows = read_rows(args.workdir / "results" / "tokenized" / f"{args.dataset}.parquet")
    rows = {i: source.read(i) for i in range(len(table_rows))}
    tokens = sum(len(r) for r in table_rows)
    hidden = manifest["hidden_size"]
    limit = (3 + 1) * hidden * 2
    print(f"{args.dataset}: {len(rows)} rows, {tokens} tokens, hidden size {hidden}; bf16 limit {limit} bytes/token")
    print(f"{'layout':<9} {'files':>6} {'bytes/token':>12} {'vs limit':>9} {'write tok/s':>12} {'read tok/s':>11}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        order = list(range(len(rows)))[::-1]
        for layout in ("shards", "per_row"):
            seconds, described = copy_into(layout, rows, tmp / layout, manifest["fingerprint"])
            store = open_store(tmp / layout, manifest["fingerprint"], layout)
            read_s = read_all(store, order, tmp)
            per_token = described["bytes"] / tokens
            print(f"{layout:<9} {described['files']:>6} {per_token:>12.1f} {per_token / limit:>9.3f} "
                  f"{tokens / seconds:>12,.0f} {tokens / read_s:>11,.0f}")
        model = str(args.workdir / "results" / "models" / "smollm2-135m-instruct")
        bare = bare_forward(model, table_rows)
        scratch = open_store(tmp / "extract", "bench", "shards")
        started = time.perf_counter()
        with scratch.writer() as writer:
            extract_transformers(model, list(enumerate(table_rows)), writer, manifest["aux_layers"], args.threads)
        extract = time.perf_counter() - started
        print(f"\nextraction, transformers backend: {tokens / extract:,.0f} tok/s; bare forward pass "
              f"{tokens / bare:,.0f} tok/s; ratio {bare / extract:.3f}")
        timing = args.workdir / "results" / "timings" / "hidden_states" / f"{args.dataset}.tsv"
        if timing.exists():
            wall = float(timing.read_text().splitlines()[1].split("\t")[0])
            print(f"extraction, vLLM backend (the workflow's job, server start included): {tokens / wall:,.0f} tok/s; "
                  f"ratio to the bare forward pass {bare / wall:.3f}")
        if args.train:
            train_speeds(args.workdir, tmp, args.threads)


if __name__ == "__main__":
    main()
