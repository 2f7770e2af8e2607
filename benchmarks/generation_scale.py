"""Generation at the scale of a real regeneration run, against simulated reasoning endpoints.

Four simulated OpenAI-compatible endpoints (``tests/sim/reasoning_server.py``, one process each)
answer like a reasoning model: ~1.5k-token answers with a long tail, latency growing with the
answer. Three runs, each printed side by side:

1. draftsmith's client, 20,000 prompts, concurrency 200, four healthy endpoints: sustained
   requests/s and client CPU seconds per 1,000 requests;
2. a bare peer client on the same endpoints and prompts (``openai.AsyncOpenAI`` behind a
   semaphore, round-robin over the endpoints: what a hand-written regeneration script does);
3. draftsmith again with one of the four endpoints refusing connections: share of prompts answered.

Then the budget fill: ``max_tokens`` 8192, concurrency 200, a 2M-token budget: tokens journaled /
budget.

    .venv/bin/python benchmarks/generation_scale.py [--prompts 20000] [--concurrency 200]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from draftsmith.data.datasets import Prompt  # noqa: E402
from draftsmith.generation.generate import GenerationSettings, Outputs, generate, make_client  # noqa: E402

LATENCY = ["--latency-s", "0.3", "--per-token-s", "0.0004"]  # ~0.9 s for a 1.5k-token answer


def start_sim(stack: ExitStack) -> str:
    proc = subprocess.Popen([sys.executable, "-m", "tests.sim.reasoning_server", "--port", "0", *LATENCY],
                            cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    stack.callback(proc.kill)
    stack.callback(proc.stdin.close)
    return f"http://127.0.0.1:{int(proc.stdout.readline())}/v1"


def refused_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def prompts(n: int) -> list[Prompt]:
    return [Prompt(f"q{i}", [f"Solve problem number {i} step by step."]) for i in range(n)]


async def draftsmith_run(urls, items, concurrency, out: Path, token_budget=None, max_tokens=4096) -> dict:
    settings = GenerationSettings(max_tokens=max_tokens, concurrency=concurrency, request_timeout_s=600,
                                  fsync_every=64, max_error_fraction=1.0)
    client = make_client(urls, "sim", settings, None, None)
    outputs = Outputs(out / "r.jsonl", out / "s.json", out / "e.jsonl", out / "j.jsonl")
    try:
        return await generate(items, client, settings, outputs, max_samples=None, token_budget=token_budget,
                              dataset="scale")
    finally:
        await client.aclose()


async def peer_run(urls, items, concurrency) -> int:
    import openai

    clients = [openai.AsyncOpenAI(base_url=u, api_key="EMPTY", max_retries=3, timeout=600) for u in urls]
    slots = asyncio.Semaphore(concurrency)
    answered = 0

    async def one(i: int, prompt: Prompt) -> None:
        nonlocal answered
        async with slots:
            reply = await clients[i % len(clients)].chat.completions.create(
                model="sim", messages=[{"role": "user", "content": prompt.turns[0]}], max_tokens=4096)
            answered += bool(reply.choices)

    await asyncio.gather(*(one(i, p) for i, p in enumerate(items)))
    for client in clients:
        await client.close()
    return answered


def timed(fn):
    cpu0, wall0 = cpu_s(), time.monotonic()
    result = fn()
    return result, time.monotonic() - wall0, cpu_s() - cpu0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--budget", type=int, default=2_000_000)
    args = parser.parse_args()
    items = prompts(args.prompts)
    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        urls = [start_sim(stack) for _ in range(4)]
        ours, wall, cpu = timed(lambda: asyncio.run(draftsmith_run(urls, items, args.concurrency, Path(tmp, "a"))))
        peer, peer_wall, peer_cpu = timed(lambda: asyncio.run(peer_run(urls, items, args.concurrency)))
        n = args.prompts
        print(f"{'run':<38} {'answered':>9} {'req/s':>8} {'CPU s/1k req':>13}")
        print(f"{'draftsmith, 4 endpoints':<38} {ours['records']:>9} {n / wall:>8.1f} {1000 * cpu / n:>13.2f}")
        print(f"{'peer (AsyncOpenAI + semaphore)':<38} {peer:>9} {n / peer_wall:>8.1f} {1000 * peer_cpu / n:>13.2f}")
        print(f"ratio draftsmith/peer: req/s {peer_wall / wall:.3f}, CPU per request {cpu / peer_cpu:.3f}")
        dead = [refused_url(), *urls[1:]]
        degraded, dwall, dcpu = timed(lambda: asyncio.run(draftsmith_run(dead, items, args.concurrency,
                                                                         Path(tmp, "b"))))
        print(f"{'draftsmith, 1 of 4 refusing':<38} {degraded['records']:>9} {n / dwall:>8.1f} "
              f"{1000 * dcpu / n:>13.2f}   answered {degraded['records'] / n:.1%}, requests by endpoint "
              f"{degraded['requests_by_endpoint']}")
        budget = asyncio.run(draftsmith_run(urls, items, args.concurrency, Path(tmp, "c"), token_budget=args.budget,
                                            max_tokens=8192))
        print(f"budget fill (max_tokens 8192, concurrency {args.concurrency}): {budget['completion_tokens']:,} / "
              f"{args.budget:,} = {budget['completion_tokens'] / args.budget:.3f} "
              f"(upper bound {1 + args.concurrency * 8192 / args.budget:.3f})")


if __name__ == "__main__":
    main()
