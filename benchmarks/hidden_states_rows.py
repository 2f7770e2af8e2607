"""Hidden-state rows of the real workload's size through the extraction path, slow storage included.

A real row is up to ~470 MB: 4 layers × 8,192 tokens × hidden 7,168 in bf16. No target that wide
runs on a CPU, so the engine side is the connector's own writer (``CpuHiddenStatesConnector._write``:
temporary name, rename, lock released) fed synthetic states of that shape, each write delayed as a
loaded shared volume would (``--write-delay-s``), ``--concurrency`` rows at once. The client side is
draftsmith's: :func:`draftsmith.hidden_states.extract.wait_written` with the size-scaled timeout, safetensors
load, speculators' ``check_hidden_states``, and the shard store. Printed: rows/s, MB/s, the longest
wait against its allowance, and peak resident memory of this process (engine side included).

    .venv/bin/python benchmarks/hidden_states_rows.py [--rows 6] [--tokens 8192] [--hidden 7168]
        [--write-delay-s 30] [--concurrency 4]
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import os
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument("--write-delay-s", type=float, default=30.0)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()

    import torch
    from safetensors.torch import load_file
    from speculators.data_generation.offline import check_hidden_states

    from draftsmith.hidden_states.connector import CpuHiddenStatesConnector
    from draftsmith.hidden_states.extract import ExtractionPolicy, wait_written
    from draftsmith.hidden_states.store import ShardStore
    from draftsmith.ops.plan import bytes_per_token

    row_bytes = args.tokens * bytes_per_token(args.hidden, 4)
    policy = ExtractionPolicy()
    tokens = list(range(args.tokens))

    def engine_writes(path: str) -> None:
        """What the connector does for one finished request: lock first, then the delayed write."""
        lock_fd = os.open(path + ".lock", os.O_CREAT | os.O_WRONLY, 0o644)
        fcntl.flock(lock_fd, fcntl.LOCK_EX)

        def write():
            time.sleep(args.write_delay_s)
            states = torch.randn(args.tokens, 4, args.hidden, dtype=torch.bfloat16)
            CpuHiddenStatesConnector._write(None, {"hidden_states": states, "token_ids": torch.tensor(tokens)},
                                            path, lock_fd)

        threading.Thread(target=write, daemon=True).start()

    with tempfile.TemporaryDirectory() as tmp:
        staging, folder = Path(tmp) / "staging", Path(tmp) / "store"
        staging.mkdir()
        folder.mkdir()
        store = ShardStore(folder, "bench", shard_mb=1024)
        waits: list[float] = []

        async def one(row: int, slots: asyncio.Semaphore, writing: asyncio.Lock, writer) -> None:
            async with slots:
                path = str(staging / f"hs_{row}.safetensors")
                engine_writes(path)
                waits.append(await wait_written(path, policy.write_timeout_s(row_bytes)))
                states = await asyncio.to_thread(load_file, path)
                check_hidden_states(states, tokens)
                async with writing:  # one shard writer, as in extract_vllm
                    await asyncio.to_thread(writer.write, row, states["hidden_states"], states["token_ids"])
                os.unlink(path)

        async def run() -> None:
            slots, writing = asyncio.Semaphore(args.concurrency), asyncio.Lock()
            with store.writer() as writer:
                await asyncio.gather(*(one(r, slots, writing, writer) for r in range(args.rows)))

        started = time.monotonic()
        asyncio.run(run())
        elapsed = time.monotonic() - started
        assert store.done([tokens] * args.rows) == set(range(args.rows))
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"{args.rows} rows of {args.tokens} tokens × 4 × {args.hidden} ({row_bytes / 1e6:.0f} MB each), "
          f"writes delayed {args.write_delay_s:.0f} s, {args.concurrency} at once")
    print(f"  {args.rows / elapsed:.3f} rows/s, {args.rows * row_bytes / 1e6 / elapsed:.1f} MB/s, {elapsed:.1f} s")
    print(f"  longest wait for a row's file {max(waits):.1f} s, allowed {policy.write_timeout_s(row_bytes):.0f} s "
          f"(speculators' client allows 10 s)")
    print(f"  peak resident memory {peak_gib:.2f} GiB")


if __name__ == "__main__":
    main()
