"""Generation against a simulated reasoning model: budgets, dead endpoints, crashes, cut reasoning."""

import asyncio
import json
import socket
import time

import pytest

from draftsmith.data.datasets import Prompt
from draftsmith.generation.client import HealthPolicy, RetryPolicy
from draftsmith.generation.generate import GenerationFailed, GenerationSettings, Outputs, generate, make_client
from tests.sim.reasoning_server import ReasoningSim, SimSettings

FAST_HEALTH = HealthPolicy(trip_after=3, cooldown_s=0.2, cooldown_max_s=1.0, outage_grace_s=1.0, probe_timeout_s=1.0)


def prompts(n, prefix="q"):
    return [Prompt(f"{prefix}{i}", [f"question number {i}"]) for i in range(n)]


def go(urls, items, tmp_path, settings, *, token_budget=None, max_samples=None, health=FAST_HEALTH):
    client = make_client(urls, "sim", settings, None, None, health=health)
    client.retry = RetryPolicy(max_attempts=settings.max_attempts, backoff_base_s=0.01, backoff_max_s=0.1)
    out = Outputs(tmp_path / "r.jsonl", tmp_path / "s.json", tmp_path / "e.jsonl", tmp_path / "j.jsonl")

    async def main():
        try:
            return await generate(items, client, settings, out, max_samples=max_samples,
                                  token_budget=token_budget, dataset="sim")
        finally:
            await client.aclose()

    return asyncio.run(main())


def refused_url() -> str:
    """An address where nothing listens: connections are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def test_the_token_budget_is_spent_not_abandoned(tmp_path):
    sim = SimSettings(think=False, content_log_mean=5.3, log_sigma=0.2, latency_s=0.01)  # ~200-token answers
    settings = GenerationSettings(max_tokens=2048, concurrency=16, request_timeout_s=30)
    with ReasoningSim(sim) as server:
        stats = go(server.base_url, prompts(400), tmp_path, settings, token_budget=30_000)
    # Before the first answer every request in flight counts as max_tokens (16 x 2048 > budget):
    # the loop must wait for real answers and go on until the budget is really reached.
    assert 30_000 <= stats["completion_tokens"] <= 30_000 + 16 * 2048
    assert stats["records"] > 100 and stats["errors"] == 0


def test_the_budget_fills_at_reasoning_scale(tmp_path):
    sim = SimSettings(reasoning_log_mean=7.0, content_log_mean=6.0, log_sigma=1.0)  # ~1.5k tokens, long tail
    settings = GenerationSettings(max_tokens=8192, concurrency=200, request_timeout_s=30)
    with ReasoningSim(sim) as server:
        stats = go(server.base_url, prompts(2000), tmp_path, settings, token_budget=1_000_000)
    assert 1_000_000 <= stats["completion_tokens"] <= 1_000_000 + 200 * 8192
    assert stats["truncated_kept"] > 0  # the long tail hits max_tokens


def test_a_dead_endpoint_does_not_take_the_traffic(tmp_path):
    settings = GenerationSettings(max_tokens=64, concurrency=32, request_timeout_s=30, max_attempts=3)
    with ReasoningSim(SimSettings(latency_s=0.02)) as server:
        stats = go([refused_url(), server.base_url], prompts(200), tmp_path, settings)
    assert stats["records"] == 200 and stats["errors"] == 0
    dead, alive = stats["requests_by_endpoint"]
    assert alive >= 200 and dead <= 3 + 32  # tripped after 3 failures (plus what was already on its way)


def test_the_only_endpoint_dying_fails_the_run_and_keeps_the_journal(tmp_path):
    settings = GenerationSettings(max_tokens=64, concurrency=8, request_timeout_s=30)
    started = time.monotonic()
    with ReasoningSim(SimSettings(latency_s=0.01, die_after=100)) as server, \
            pytest.raises(GenerationFailed, match=r"no endpoint reachable.*no output was written.*rerun resumes"):
        go(server.base_url, prompts(300), tmp_path, settings)
    assert time.monotonic() - started < 60
    assert not (tmp_path / "r.jsonl").exists()
    journaled = (tmp_path / "j.jsonl").read_text().splitlines()
    assert 90 <= len(journaled) <= 100


def test_time_to_fail_is_the_documented_grace_even_while_probes_back_off(tmp_path):
    # Probes back off to 60 s apart (the default policy): a failure count would stretch the outage
    # to minutes. The grace is time since the endpoint went out, so the run fails right after it.
    grace = 3.0
    settings = GenerationSettings(max_tokens=64, concurrency=8, request_timeout_s=30)
    with ReasoningSim(SimSettings(latency_s=0.01, die_after=100)) as server:
        started = time.monotonic()
        with pytest.raises(GenerationFailed, match=r"no endpoint reachable for [34] s \(outage_grace_s 3\)"):
            go(server.base_url, prompts(300), tmp_path, settings, health=HealthPolicy(outage_grace_s=grace))
        elapsed = time.monotonic() - started
    # Generous for a slow machine; a failure count with probes backing off to 60 s took minutes.
    assert grace <= elapsed < 60


def test_reasoning_cut_by_max_tokens_is_an_answer_not_an_error(tmp_path):
    settings = GenerationSettings(max_tokens=64, concurrency=8, request_timeout_s=30)
    with ReasoningSim(SimSettings(reasoning_log_mean=6.5, log_sigma=0.1, reasoning_field="reasoning")) as server:
        stats = go(server.base_url, prompts(50), tmp_path, settings)
        requests = server.stats.requests
    assert stats["records"] == 50 and stats["errors"] == 0 and stats["retries"] == 0 and requests == 50
    for line in (tmp_path / "r.jsonl").read_text().splitlines():
        answer = json.loads(line)["messages"][-1]
        assert answer["content"] == "" and answer["reasoning"] and json.loads(line)["finish_reason"] == "length"
    assert stats["truncated_kept"] == 50 and stats["reasoning_records"] == 50


def test_retry_after_is_honoured_and_bounded(tmp_path):
    settings = GenerationSettings(max_tokens=32, concurrency=4, request_timeout_s=30)
    with ReasoningSim(SimSettings(retry_after="1")) as server:
        started = time.monotonic()
        stats = go(server.base_url, prompts(4), tmp_path, settings)
    assert stats["records"] == 4 and stats["retries_by_class"] == {"http_429": 4}
    assert time.monotonic() - started >= 1.0
    with ReasoningSim(SimSettings(retry_after="inf")) as server:  # not a number of seconds: ignored
        stats = go(server.base_url, prompts(4), tmp_path / "inf", settings)
    assert stats["records"] == 4
