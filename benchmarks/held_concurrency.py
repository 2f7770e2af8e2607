"""The concurrency a cell is labelled with against the one it held: the grid's measurement (draftsmith's run_set:
a set cycled to two rounds, timed until the first worker runs out of work) beside the protocol it replaced (one
slot per prompt, the whole set timed from its first request to its last answer), on one vLLM server, each
concurrency and evaluation set of a config. For each it prints the requests in flight from the client and the
requests the engine ran (vllm:num_requests_running), averaged over the timed window and at its peak, whether
it held (draftsmith's rule: both the client's mean and the engine's peak at 0.9 of it), and the output tok/s.

    .venv/bin/python benchmarks/held_concurrency.py --concurrency 4 12 16
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from draftsmith.config.load import EMBEDDED, WORKFLOW_DIR, load_layers, validate_config  # noqa: E402
from draftsmith.config.target import resolve  # noqa: E402
from draftsmith.evaluation.measure import evaluate as ev  # noqa: E402
from draftsmith.generation.client import ChatClient, RetryPolicy  # noqa: E402
from draftsmith.generation.server import managed_server  # noqa: E402


async def whole_set(base_url: str, model: str, prompts: list, sampling: dict, concurrency: int) -> dict:
    """The protocol before: a slot per prompt held for the whole set, from the first request to the last answer."""
    client = ChatClient(base_url, model, request_timeout_s=3600, retry=RetryPolicy(max_attempts=2),
                        max_connections=concurrency)
    slots, spans, tokens, running = asyncio.Semaphore(concurrency), [], [0], []
    done = asyncio.Event()

    async def one(p) -> None:
        async with slots:
            messages = [{"role": "system", "content": p.system}] if p.system else []
            for turn in p.turns:
                messages.append({"role": "user", "content": turn})
                sent = time.monotonic()
                result = await client.chat(messages, sampling)
                spans.append((sent, time.monotonic()))
                messages.append({"role": "assistant", "content": result.content})
                tokens[0] += result.completion_tokens

    async def sample(metrics) -> None:
        while not done.is_set():
            await asyncio.sleep(ev.SAMPLE_S)
            reading = ev.parse_counters((await metrics.get(ev.root_of(base_url) + "/metrics")).text, "vllm")
            running.append(reading.get("running", 0.0))

    import httpx

    async with httpx.AsyncClient(timeout=30) as metrics:
        sampler = asyncio.create_task(sample(metrics))
        start = time.monotonic()
        await asyncio.gather(*(one(p) for p in prompts))
        end = time.monotonic()
        done.set()
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
    await client.aclose()
    return {"in_flight": ev.mean_in_flight(spans, start, end), "running": statistics.fmean(running) if running
            else None, "peak": max(running, default=None), "readings": len(running), "tok_s": tokens[0] / (end - start),
            "requests": len(spans)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, help="laid over the embedded default (default: the default alone)")
    parser.add_argument("--concurrency", nargs="+", type=int, help="default: the config's")
    args = parser.parse_args()
    config = validate_config(load_layers([WORKFLOW_DIR / EMBEDDED, *([args.config] if args.config else [])], {}))
    evaluation = config["evaluation"]
    target = resolve(config["target"], REPO)
    sets = ev.prompt_sets(evaluation, REPO)
    sampling = ev.sampling(evaluation["max_tokens"], 0.0, False)
    spec = ev.for_measurement(ev.server_spec("vllm", target, config["server"]))
    rows = ["| set | prompts | concurrency | protocol | requests | in flight (client) | running (engine: mean, "
            "peak) | held | tok/s |", "|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    with managed_server(spec, REPO / "logs" / "held_concurrency.server.log") as server:
        ev.warm_up(server.base_url, target.model, sets, evaluation["max_tokens"])
        for c in args.concurrency or evaluation["concurrency"]:
            for name, prompts in sets.items():
                before = asyncio.run(whole_set(server.base_url, target.model, prompts, sampling, c))
                now = asyncio.run(ev.run_set(server.base_url, target.model, prompts, sampling, c))[0]
                for label, requests, in_flight, running, peak, readings, tok_s in (
                        ("whole set (before)", before["requests"], before["in_flight"], before["running"],
                         before["peak"], before["readings"], before["tok_s"]),
                        ("full window (now)", now.sent, now.in_flight, now.running, now.peak_running, now.readings,
                         now.as_dict()["output_tok_s"])):
                    held = ev.hold(ev.SetRun(len(prompts), c, requests, 0, 0, 1.0, in_flight, running, peak,
                                                    readings).as_dict(), None, c) is None
                    engine = "–" if running is None else f"{running:.2f}, {peak:g} ({readings} readings)"
                    rows.append(f"| {name} | {len(prompts)} | {c} | {label} | {requests} | {in_flight:.2f} | "
                                f"{engine} | {'yes' if held else 'no'} | {tok_s:.1f} |")
                print(rows[-2], rows[-1], sep="\n", flush=True)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
