"""``./run.sh status`` at the scale of a real run: 8 datasets × 100,000 prompts, journals of that size.

Writes a synthetic run folder (prompt files, journals of records the size of real ones with their
answers, a hidden-state index, training metrics), then times ``draftsmith.ops.status.collect``:

1. cold: no cache, every journal read once (what the first call after a long run costs);
2. warm: 500 records appended to every journal since the last call (what a watcher sees every
   few minutes), the goal being under 2 s;
3. the peer: reading every journal in full with ``json.loads`` per record, what a status view that
   does not keep its place would do on each call.

    .venv/bin/python benchmarks/status_scale.py [--datasets 8] [--prompts 100000] [--answer-chars 1500]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from draftsmith.ops import status  # noqa: E402


def record(dataset: str, i: int, answer: str) -> str:
    return json.dumps({"format": 2, "id": f"{dataset}-{i}", "prompt_hash": "0123456789abcdef", "status": "ok",
                       "messages": [{"role": "user", "content": f"question {i}"},
                                    {"role": "assistant", "content": answer, "reasoning": answer}],
                       "finish_reason": "stop", "usage": {"prompt_tokens": 40, "completion_tokens": 700},
                       "latency_s": 12.5}) + "\n"


def write_run(root: Path, datasets: list[str], prompts: int, answer_chars: int) -> None:
    answer = "x" * answer_chars
    (root / ".snakemake").mkdir()
    for name in datasets:
        (root / "results/prompts").mkdir(parents=True, exist_ok=True)
        (root / f"results/prompts/{name}.jsonl").write_text(
            "".join(json.dumps({"id": f"{name}-{i}", "messages": [{"role": "user", "content": f"question {i}"}]})
                    + "\n" for i in range(prompts)))
        journal = root / f"results/responses/.journal/{name}-0123456789ab.jsonl"
        journal.parent.mkdir(parents=True, exist_ok=True)
        with journal.open("w") as fh:
            for i in range(prompts):
                fh.write(record(name, i, answer))


def append(root: Path, datasets: list[str], start: int, n: int, answer_chars: int) -> None:
    for name in datasets:
        with (root / f"results/responses/.journal/{name}-0123456789ab.jsonl").open("a") as fh:
            fh.writelines(record(name, i, "y" * answer_chars) for i in range(start, start + n))


def full_reread(root: Path, datasets: list[str]) -> int:
    total = 0
    for name in datasets:
        with (root / f"results/responses/.journal/{name}-0123456789ab.jsonl").open("rb") as fh:
            total += sum(json.loads(line)["usage"]["completion_tokens"] for line in fh)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=100_000)
    parser.add_argument("--answer-chars", type=int, default=1500)
    args = parser.parse_args()
    datasets = [f"set{i}" for i in range(args.datasets)]
    config = {"datasets": {n: {"token_budget": 10_000_000} for n in datasets}, "train": {"epochs": 3}}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        started = time.monotonic()
        write_run(root, datasets, args.prompts, args.answer_chars)
        size = sum(p.stat().st_size for p in root.rglob("*.jsonl"))
        print(f"wrote {args.datasets} × {args.prompts:,} prompts and journals ({size / 2**30:.2f} GiB) "
              f"in {time.monotonic() - started:.1f} s")
        os.chdir(root)
        cold = status.collect(config).seconds
        append(root, datasets, args.prompts, 500, args.answer_chars)
        warm = status.collect(config)
        t0 = time.monotonic()
        full_reread(root, datasets)
        peer = time.monotonic() - t0
        assert warm.datasets[0].answered == args.prompts + 500
        print(f"status, cold (first call, every journal read once): {cold:.2f} s")
        print(f"status, warm (500 new records per journal): {warm.seconds:.2f} s (goal < 2 s)")
        print(f"peer, every journal re-read with json.loads: {peer:.2f} s → warm/peer {warm.seconds / peer:.3f}")


if __name__ == "__main__":
    main()
