"""The shard writer against a plain write + fsync of the same bytes to the same place, side by side.

    .venv/bin/python benchmarks/hidden_states_writer.py [--dirs /dev/shm /tmp] [--hidden 4096] [--rows 16]
                                                        [--tokens 2048] [--rounds 3]

Rows shaped like a target's states (``[tokens, 4, hidden]`` bf16, Qwen3-8B's width by default, 64 MB a
row) go through draftsmith's ``ShardStore`` writer (queue, writer thread, streamed shard file,
xxh3-128, fsync, rename, index line), timed from the first ``write`` to the end of ``close``. The
peer writes the same number of bytes with ``os.write`` into one file in the same folder and fsyncs it.
In memory (/dev/shm) the ratio is the writer's own cost, free of a shared disk's noise (issue 37's
goal: at least 0.8x; the writer before it measured 0.20x); on a disk it is what extraction would see.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from draftsmith.hidden_states.store import ShardStore, fingerprint


def rows(count: int, tokens: int, hidden: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(tokens, 4, hidden, generator=generator).to(torch.bfloat16) for _ in range(count)]


def writer_seconds(folder: Path, states: list[torch.Tensor]) -> tuple[float, int]:
    store = ShardStore(folder / "store", fingerprint({"bench": 1}, [1, 2, 3], 4, "bench"), shard_mb=1024)
    ids = [torch.arange(values.shape[0]) for values in states]  # a row's own (safetensors refuses shared ones)
    started = time.perf_counter()
    with store.writer() as writer:
        for row, values in enumerate(states):
            writer.write(row, values, ids[row])
    seconds = time.perf_counter() - started
    return seconds, store.describe()["bytes"]


def plain_seconds(folder: Path, states: list[torch.Tensor]) -> float:
    """The rows' own bytes, already in memory, written to one file and fsynced: what the storage allows."""
    started = time.perf_counter()
    fd = os.open(folder / "plain.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for values in states:
            view = memoryview(values.view(torch.uint8).numpy()).cast("B")
            while view:
                view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dirs", nargs="+", type=Path, default=[Path("/dev/shm"), Path(tempfile.gettempdir())])
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    states = rows(args.rows, args.tokens, args.hidden)
    print(f"{args.rows} rows x {args.tokens} tokens x 4 layers x hidden {args.hidden} (bf16), "
          f"{os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}")
    print("| where | round | writer GB/s | plain write+fsync GB/s | ratio |")
    print("|---|---:|---:|---:|---:|")
    for base in args.dirs:
        ratios, best = [], {"writer": float("inf"), "plain": float("inf")}
        for round_ in range(args.rounds + 1):  # round 0 warms the filesystem's pages up, and is not counted
            work = Path(tempfile.mkdtemp(prefix="writer-bench.", dir=base))
            try:  # who goes first alternates: a fresh file's first pages cost more on some filesystems
                for side in ("writer", "plain") if round_ % 2 else ("plain", "writer"):
                    if side == "writer":
                        seconds, nbytes = writer_seconds(work, states)
                        shutil.rmtree(work / "store")
                    else:
                        plain = plain_seconds(work, states)
                        (work / "plain.bin").unlink()
            finally:
                shutil.rmtree(work, ignore_errors=True)
            if round_ == 0:
                continue
            ratios.append(plain / seconds)
            best = {"writer": min(best["writer"], seconds), "plain": min(best["plain"], plain)}
            print(f"| {base} | {round_} | {nbytes / seconds / 1e9:.2f} | {nbytes / plain / 1e9:.2f} | "
                  f"{plain / seconds:.2f}x |", flush=True)
        print(f"| {base} | median of rounds | | | **{statistics.median(ratios):.2f}x** |")
        print(f"| {base} | best of each side | {nbytes / best['writer'] / 1e9:.2f} | "
              f"{nbytes / best['plain'] / 1e9:.2f} | **{best['plain'] / best['writer']:.2f}x** |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
