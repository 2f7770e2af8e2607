"""Regenerate a dataset's answers with the target model: resumable, budgeted, counted, loud on failure.

Semantics (documented in docs/stages.md):
- **Resume by content.** Each finished record is appended to a journal (flushed and fsynced every
  ``fsync_every`` records) with its prompt id and a digest of the prompt (:attr:`Prompt.digest`: its
  turns, and its tools and tool results where it has them). A rerun skips a prompt whose id *and*
  digest are journaled, so an edited prompt is answered again and nothing else is. A conversation is
  journaled whole once finished: one a kill cut short is asked again from its first turn, a
  journaled one never. The journal's name carries a digest of what changes an answer (target name,
  sampling, chat-template arguments, how tool calls travel): never a path, so moving the project
  keeps every journal. A line cut by a kill is detected and dropped.
- **Token budget.** Prompts are launched in file order while ``completion tokens journaled +
  expected tokens of requests in flight < token_budget``, the expectation per request being the
  running mean of finished records (``max_tokens`` before the first finishes). When the
  expectation says "full" but the journaled tokens do not, the loop waits for answers in flight
  and checks again, so the budget is spent, not abandoned. Requests in flight always finish: the
  total exceeds the budget by at most the answers in flight. ``max_samples`` works the same way.
- **finish_reason policy.** ``keep`` keeps truncated answers, ``mark`` keeps them with
  ``"truncated": true``, ``drop`` journals them as dropped (not retried on resume) and counts
  them. A reasoning model cut while thinking (``content: null``) is a truncated answer. A turn
  cut by ``max_tokens`` ends a multi-turn conversation: later turns would build on a cut answer.
- **Tool calls.** A row with tools sends them on every request (``tool_choice: auto``). The model's
  calls are paired with the dataset's next step of results within the stretch up to the next user
  turn, each with the result of its name and arguments (:mod:`draftsmith.generation.tool_pairing`),
  and each paired call gets its result as a ``tool`` message before the model is asked again. A call
  that cannot be paired cuts the conversation there, keeping the turn that made it (its tokens are
  the model's own): ``other_function`` (a name the step does not have in that place),
  ``other_arguments`` (its name's result was called with other arguments; ``unmatched_calls:
  by_name`` answers it all the same, counted as ``results_by_name``), ``more_calls_than_results`` (no
  step left where the data goes on), ``parallel_calls`` (more calls in one turn than the step has
  results; fewer are paired with the first). A row with an environment (BFCL multi-turn) runs every call instead
  (``unmatched_calls: execute``, its default): on the row's own instances, in whatever order and number the model
  makes them, each answered with its result or BFCL's error text, up to BFCL's step limit per stretch (counted
  ``step_limit``), each call in a thread bounded by ``bfcl.CALL_TIMEOUT_S`` (past it: a timeout error the
  model sees, its next call ending the conversation, counted ``call_timeout``); a row whose instances cannot be set
  up is an error (``setup_failed``: in the errors file,
  named in the log and the stats, counted against ``max_error_fraction``), journaled never, so the next run tries
  it again. Where the data has nothing after the calls (no result,
  no later turn: a single-turn tool set, a prompt with tools) the conversation ends at the model's
  calls, counted as ``ends_at_call``, no cut. A stretch the model ends with steps unused is a natural
  end (``fewer_calls``), counted apart, and the next user turn follows. A turn whose text holds the
  parser's call markup with no call read is counted and warned about (the parser did not read it).
  The history sent carries the answers' reasoning as ``tokenize.reasoning`` keeps it (``drop``: none,
  ``think_tags``: inline; set for tool sets only), so the server's prompts are the rows' (Qwen3's template
  renders the reasoning of a tool stretch's earlier answers).
  With ``tool_rendering: text`` the tools and results travel as text (no parser on the server) and
  the calls are read from the answer's ``<tool_call>`` blocks. A hosted API returns no token ids:
  there the tool-call tokens are the chat template's rendering (``tool_call_tokens: template``).
- **A conversation that outgrows the context ends.** Before each request the prompt is counted with
  the target's tokenizer and template (:class:`ContextLimit`); one that leaves no room for an answer
  token is not sent: the conversation ends there, its earlier turns kept (``ends_at_context``), or,
  when its first request already does not fit, is journaled as ``dropped_context``. Neither is an
  error, so neither counts against ``max_error_fraction``.
- **Trajectories on their own history.** A prompt with the dataset's answers (:attr:`Prompt.history`: a
  SWE-agent trajectory, any set with ``generation.history: dataset``) is answered turn by turn, each turn one
  request on the dataset's conversation up to it, and each answer its own record (id ``{id}#{k}``, marked
  ``"supervise": "last"``: its row supervises that turn only), journaled as it finishes, so a rerun resends no
  journaled turn. The budget counts every turn's completion, and once it is spent a trajectory in flight asks
  no further turn (its answered turns are rows; a larger budget resumes it); ``max_samples`` and the in-flight
  estimate count trajectories. A turn whose prompt leaves no room for an answer (the context, and for these rows
  ``tokenize.max_length``, which their single row must fit) is journaled as ``dropped_context`` and ends the
  trajectory: its later turns are longer still. No error either. A turn asks for no more answer tokens than its
  prefix leaves there (``max_tokens`` lowered): the row would cut them away.
- **Round trip in the first minute.** The first ``EARLY_CHECK_ANSWERS`` answers of a run are
  checked as the tokenize stage will check them (``early_check``); a mismatch above the limits
  stops the run, journal kept, with the likely cause and the setting that fixes it.
- **Failures.** A prompt that still fails after its retries goes to the errors file and is tried
  again by the next run. The run fails, keeping its journal and writing no outputs, when more
  than ``max_error_fraction`` of the prompts it tried failed, when every endpoint stayed
  unreachable (see :mod:`draftsmith.generation.client`), or when the managed server exited.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import statistics
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tqdm import tqdm

from draftsmith.core import jsonl
from draftsmith.core.atomic import write_json, write_jsonl
from draftsmith.core.digest import ids_digest, json_digest
from draftsmith.data import agent_shapes, bfcl
from draftsmith.data.chat import (
    Renderer,
    history_reasoning,
    parse_text_tool_calls,
    prepare_messages,
    text_rendering,
)
from draftsmith.data.datasets import Prompt
from draftsmith.generation.client import (
    ChatClient,
    ChatResult,
    EndpointsDown,
    HealthPolicy,
    RequestFailed,
    RetryPolicy,
)
from draftsmith.generation.tool_pairing import UNMATCHED_CALLS, call_markup, pair_calls

log = logging.getLogger(__name__)

RECORD_FORMAT = 2
EARLY_CHECK_ANSWERS = 32
# The error class of a row whose tool instances could not be set up (BFCL multi-turn): an error like a request that
# failed, never journaled, so a rerun once the environment sets up regenerates it; it counts against
# max_error_fraction, so a set whose environment is broken fails its job instead of finishing without those rows.
SETUP_FAILED = "setup_failed"


class GenerationInterrupted(RuntimeError):
    pass


class GenerationFailed(RuntimeError):
    pass


@dataclass
class GenerationSettings:
    max_tokens: int = 512
    temperature: float = 0.0
    top_p: float | None = None
    concurrency: int = 200
    request_timeout_s: float = 1800.0
    connect_timeout_s: float = 30.0
    max_attempts: int = 5
    finish_reason_policy: str = "keep"
    chat_template_kwargs: dict[str, Any] | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)
    fsync_every: int = 16
    max_error_fraction: float = 0.01
    return_token_ids: bool = False
    tool_rendering: str = "template"  # tokenize.tool_rendering, for a dataset with tools (see tool_options)
    tool_call_parser: str | None = None  # target.tool_call_parser, where a managed server parses the calls
    unmatched_calls: str | None = None  # a call whose arguments no result has: None is cut (tool_pairing)
    reasoning: str = "template"  # tokenize.reasoning, for a dataset with tools: what the history sent keeps
    history: str | None = None  # generation.history: the set's rows carry the dataset's answers (Prompt.history)

    @classmethod
    def from_config(cls, cfg: dict, **extra) -> GenerationSettings:
        known = {k: v for k, v in {**cfg, **extra}.items() if k in cls.__dataclass_fields__}
        return cls(**known)

    def answer_affecting(self) -> dict[str, Any]:
        """What changes an answer (and so names the journal)."""
        body: dict[str, Any] = {"max_tokens": self.max_tokens, "temperature": self.temperature}
        if self.top_p is not None:
            body["top_p"] = self.top_p
        if self.chat_template_kwargs:
            body["chat_template_kwargs"] = self.chat_template_kwargs
        return {**body, **self.extra_body}

    def request_body(self) -> dict[str, Any]:
        return {**self.answer_affecting(), **({"return_token_ids": True} if self.return_token_ids else {})}

    def sampling(self) -> dict[str, Any]:
        """How the answers were sampled: the temperature and what else shapes the target's distribution (what
        predicts a server's acceptance on these answers, and what the export gate serves them at)."""
        return {"temperature": self.temperature, **({"top_p": self.top_p} if self.top_p is not None else {}),
                **{k: v for k, v in self.extra_body.items() if k in SAMPLING_FIELDS}}

    def tool_affecting(self) -> dict[str, Any]:
        """How tool calls travel and are answered: empty for the defaults (``unmatched_calls: cut`` is the
        default's behaviour), so journals without tools keep their names."""
        settings = {"tool_rendering": self.tool_rendering, "tool_call_parser": self.tool_call_parser,
                    "unmatched_calls": None if self.unmatched_calls == "cut" else self.unmatched_calls,
                    "reasoning": self.reasoning}
        return {k: v for k, v in settings.items() if v != self.__dataclass_fields__[k].default}

    def __post_init__(self) -> None:
        if self.unmatched_calls not in (None, *UNMATCHED_CALLS):
            raise ValueError(f"generation.unmatched_calls: {self.unmatched_calls!r} is not one of "
                             f"{', '.join(UNMATCHED_CALLS)}")


TOOL_RENDERINGS = ("template", "text")
# The request fields of vLLM's (and SGLang's) sampling that change the distribution an answer is drawn from.
SAMPLING_FIELDS = ("top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")


# A model default of these values changes nothing (vLLM's neutral ones).
NEUTRAL_SAMPLING = {"top_k": (0, -1), "top_p": (1.0,), "min_p": (0.0,), "repetition_penalty": (1.0,),
                    "presence_penalty": (0.0,), "frequency_penalty": (0.0,)}


def model_sampling(model: str, revision: str | None = None) -> dict[str, Any]:
    """The sampling the target ships in its ``generation_config.json`` (a folder, or a hub id from the local
    cache), which vLLM (``--generation-config auto``, its default, read the same way) and SGLang apply to a
    request that leaves it out: Qwen3's top_k 20 and top_p 0.95 reach every answer generated at
    ``temperature: 0.6`` alone, Qwen2.5's repetition_penalty 1.05 every answer. None shipped, or unreadable
    (said): none."""
    from transformers import GenerationConfig

    try:
        config = GenerationConfig.from_pretrained(model, revision=revision, local_files_only=True).to_diff_dict()
    except OSError:
        return {}
    except Exception as err:  # a file the engine would refuse too: the answers' sampling is then the request's
        log.warning("%s: its generation_config.json is unreadable (%s); its sampling defaults are not counted",
                    model, err)
        return {}
    out = {}
    for key in SAMPLING_FIELDS:
        value = config.get(key)
        try:
            value = None if value is None else int(value) if key == "top_k" else float(value)
        except (TypeError, ValueError):
            log.warning("%s: generation_config.json %s=%r is not a number; left out", model, key, value)
            continue
        if value is not None and value not in NEUTRAL_SAMPLING[key]:
            out[key] = value
    return out


def answer_sampling(datasets: dict[str, dict], model_defaults: dict[str, Any]) -> dict[str, dict[str, Any] | None]:
    """Each dataset's answers' sampling from the ``datasets`` config: what its requests sent
    (:meth:`GenerationSettings.sampling`) over the target's own defaults (:func:`model_sampling`), as the
    server applied them; None for a pre-tokenized one, whose answers the workflow did not generate."""
    return {name: None if cfg.get("kind") == "tokenized" else
            {**model_defaults, **GenerationSettings.from_config(cfg.get("generation") or {}).sampling()}
            for name, cfg in datasets.items()}


def tool_options(prompts: list[Prompt], parser: str | None, rendering: str, managed_engine: str | None,
                 where: str, reasoning: str = "template") -> dict[str, Any]:
    """The :class:`GenerationSettings` tool fields of a dataset: none without tools. A managed server
    reads the model's calls only with the target's parser, so one is required there unless the tools
    travel as text; endpoints run elsewhere (``managed_engine`` None) bring their own parsing. A tool
    stretch's history is sent with the reasoning ``tokenize.reasoning`` keeps (``reasoning``;
    :func:`draftsmith.data.chat.history_reasoning`)."""
    if not any(p.tools for p in prompts):
        return {}
    if rendering not in TOOL_RENDERINGS:
        raise ValueError(f"tokenize.tool_rendering: {rendering!r} is not one of {', '.join(TOOL_RENDERINGS)}")
    if rendering == "text" or managed_engine is None:
        return {"tool_rendering": rendering, "reasoning": reasoning}
    if not parser:
        raise ValueError(f"{where}: its rows have tools, and the managed {managed_engine} server returns the model's "
                         "tool calls only through a parser: set target.tool_call_parser (e.g. hermes for Qwen3), "
                         "or tokenize.tool_rendering: text to send the tools as text")
    return {"tool_rendering": rendering, "tool_call_parser": parser, "reasoning": reasoning}


@dataclass(frozen=True)
class ContextLimit:
    """The target's context (``tokens``: the server's max_model_len, else the model's own) and a request's prompt
    counted as the server renders it, with the target's tokenizer and chat template. vLLM answers a prompt up to
    one token short of the context (it shortens max_tokens to fit) and refuses a longer one, which made the
    conversation an error."""

    tokens: int
    renderer: Renderer
    tool_rendering: str = "template"

    def leaves_no_room(self, messages: list[dict], tools: list[dict] | None) -> bool:
        """Whether the prompt leaves no room for one answer token."""
        return self.answer_room(messages, tools, 1) == 0

    def answer_room(self, messages: list[dict], tools: list[dict] | None, want: int) -> int:
        """The answer tokens the prompt leaves within the context, at most ``want`` (0: none). A rendering whose
        bytes and ``want`` fit the context is not tokenized (a token spans at least a byte)."""
        if tools and self.tool_rendering == "text":
            messages, tools = text_rendering(messages, tools), None
        try:
            text = self.renderer.with_tools(tools).text(prepare_messages(messages, "template"), True)
        except Exception as err:  # the template refuses the conversation: so would the server, an error of the row's
            raise RequestFailed("template", f"the chat template cannot render the prompt to count it against the "
                                            f"context ({type(err).__name__}: {err})", 0) from None
        if len(text.encode()) + want <= self.tokens:
            return want
        return max(0, min(want, self.tokens - len(self.renderer.ids(text))))


def context_tokens(server_tokens: int | None, model_tokens: int | None, prompts: list[Prompt],
                   max_length: int) -> int | None:
    """The tokens a request's prompt and one answer token must fit: the server's and the model's context, and
    ``tokenize.max_length`` where the set has trajectories, whose turns are each one row (a prompt past it would
    leave the row no supervised token). None when none is known."""
    row_tokens = max_length if any(p.history is not None for p in prompts) else None
    return min((n for n in (server_tokens, model_tokens, row_tokens) if n), default=None)


def model_context(target) -> int | None:
    """The target's own context (its config's max_position_embeddings), which a server without max_model_len
    serves; None, logged, where it is unknown."""
    from draftsmith.config.target import facts_without_weights

    try:
        return facts_without_weights(target).max_position_embeddings
    except FileNotFoundError as err:
        log.info("the target's context length is unknown (%s); prompts are not counted against it", err)
        return None


def settings_key(model_name: str, settings: GenerationSettings) -> str:
    """Names the journal: everything that changes an answer, nothing about where files live."""
    tools = settings.tool_affecting()
    history = [{"history": settings.history}] if settings.history is not None else []  # set: rows answered otherwise
    return json_digest([RECORD_FORMAT, model_name, settings.answer_affecting(), settings.finish_reason_policy,
                        *([tools] if tools else []), *history], KEY_LENGTH)


JOURNAL_DIR = Path("results/responses/.journal")
KEY_LENGTH = 12


def journal_path(folder: Path, dataset: str, key: str) -> Path:
    """A dataset's journal for one settings key (:func:`settings_key`)."""
    return Path(folder) / f"{dataset}-{key}.jsonl"


def journals_of(folder: Path, dataset: str) -> list[Path]:
    """Every journal of ``dataset``, whatever its settings: names that are exactly
    ``{dataset}-{key}.jsonl``. A glob on ``{dataset}-*`` also matched the journals of a dataset
    named ``{dataset}-v2``, and redo deleted them."""
    name = re.compile(re.escape(dataset) + rf"-[0-9a-f]{{{KEY_LENGTH}}}\.jsonl")
    return sorted(p for p in Path(folder).glob(f"{dataset}-*.jsonl") if name.fullmatch(p.name))


class Journal:
    """Append-only record log; tolerant of a last line cut by kill -9."""

    def __init__(self, path: Path, fsync_every: int):
        self.path = path
        self.fsync_every = fsync_every
        self._pending = 0
        self._fh = None

    def load(self) -> dict[str, dict]:
        """The latest record per prompt id."""
        records: dict[str, dict] = {}
        for rec in jsonl.read_appended(self.path):
            if rec.get("format") != RECORD_FORMAT:
                raise ValueError(f"{self.path}: prompt {rec.get('id')!r} has record format {rec.get('format')!r}, "
                                 f"this draftsmith writes format {RECORD_FORMAT}; delete the journal "
                                 "to regenerate that dataset")
            records[rec["id"]] = rec
        if jsonl.drop_cut_tail(self.path):
            log.warning("%s: its last line was cut (by a kill?); dropped, that prompt is sent again", self.path)
        return records

    def append(self, record: dict) -> None:
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = self.path.open("a", encoding="utf-8")
        self._fh.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._pending += 1
        if self._pending >= self.fsync_every:
            self.sync()

    def sync(self) -> None:
        if self._fh is not None and self._pending:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._pending = 0

    def close(self) -> None:
        self.sync()
        if self._fh is not None:
            self._fh.close()
            self._fh = None


@dataclass
class Outputs:
    responses: Path
    stats: Path
    errors: Path
    journal: Path


@dataclass
class _Run:
    """Mutable state of one generation run."""

    done: dict[str, dict]
    completion_tokens: int = 0
    kept: int = 0
    in_flight: int = 0
    errors: list[dict] = field(default_factory=list)
    prompts_this_run: int = 0
    cost: float = 0.0
    tokens_this_run: int = 0
    fatal: str | None = None
    started: float = field(default_factory=time.monotonic)
    fresh: list[dict] = field(default_factory=list)  # the first answers of this run, for the early check
    early_checked: bool = False

    def expected_per_request(self, max_tokens: int) -> float:
        return self.completion_tokens / self.kept if self.kept else float(max_tokens)


@dataclass
class Limits:
    max_samples: int | None = None
    token_budget: int | None = None

    def reached(self, run: _Run, max_tokens: int | None = None) -> bool:
        """Whether the journaled answers meet the limits; with ``max_tokens``, counting the answers
        in flight as their expected size (``max_tokens`` until the first one finishes)."""
        in_flight = run.in_flight if max_tokens is not None else 0
        if self.max_samples is not None and run.kept + in_flight >= self.max_samples:
            return True
        expected = in_flight * run.expected_per_request(max_tokens or 0)
        return self.token_budget is not None and run.completion_tokens + expected >= self.token_budget


async def generate(prompts: list[Prompt], client: ChatClient | None, settings: GenerationSettings, outputs: Outputs,
                   *, max_samples: int | None, token_budget: int | None, dataset: str,
                   server_exit: Callable[[], str | None] | None = None,
                   early_check: Callable[[list[dict]], str | None] | None = None,
                   context: ContextLimit | None = None) -> dict:
    """Answer ``prompts`` through ``client`` and write responses, stats and errors atomically.

    ``client`` may be None when :func:`has_work` said there is nothing to send. ``server_exit``
    returns a message once a managed server has exited, which stops the run at once.
    ``early_check`` returns a message when the run's first answers would fail tokenization: it is
    called once, with the first ``EARLY_CHECK_ANSWERS`` (or all, when the run answers fewer).
    ``context`` ends a conversation whose next prompt would not fit the target's context (None: not checked).
    """
    bare = [p.id for p in prompts if p.tools and p.environment is None]
    if settings.unmatched_calls == "execute" and bare:
        raise GenerationFailed(f"{dataset}: generation.unmatched_calls: execute runs the target's calls on a row's own "
                               f"instances, which only BFCL multi-turn rows have: {len(bare)} rows with tools have "
                               f"none (first: {bare[0]}); set cut or by_name")
    journal = Journal(outputs.journal, settings.fsync_every)
    run = _resume(prompts, journal)
    limits = Limits(max_samples, token_budget)
    todo = [p for p in prompts if not _journaled(run.done, p)]
    log.info("%s: %d prompts, %d already journaled, %d to send", dataset, len(prompts), len(prompts) - len(todo),
             len(todo))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        loop.add_signal_handler(sig, stop.set)
    bar = tqdm(total=_bar_total(len(prompts), max_samples, token_budget), desc=dataset,
               unit="tok" if token_budget else "rec", initial=run.completion_tokens if token_budget else run.kept,
               mininterval=2.0, dynamic_ncols=True)
    watchdog = asyncio.create_task(_watch_server(server_exit, run, stop)) if server_exit else None
    try:
        await _launch_all(todo, client, settings, journal, run, bar, stop, limits, early_check, context)
        if early_check and run.fresh and not run.early_checked and not stop.is_set():
            run.fatal = early_check(run.fresh)
    finally:
        if watchdog:
            watchdog.cancel()
        journal.close()
        bar.close()
        for sig, handler in previous.items():
            loop.remove_signal_handler(sig)
            signal.signal(sig, handler)  # e.g. the managed server's "stop me" handler
    resume_hint = f"{len(run.done)} records are journaled in {outputs.journal} and a rerun resumes from there"
    if run.fatal:
        raise GenerationFailed(f"{dataset}: {run.fatal}; no output was written; {resume_hint}")
    if stop.is_set():
        raise GenerationInterrupted(f"{dataset}: interrupted; {resume_hint}")
    _check_error_fraction(dataset, prompts, run, settings.max_error_fraction, resume_hint)
    stats = _stats(dataset, prompts, run, client, time.monotonic() - run.started, limits, settings)
    _warn_parser(dataset, stats)
    _log_executed(dataset, stats)
    ordered = [r for p in prompts for r in _records_of(run.done, p) if r["status"] == "ok"]
    write_jsonl(outputs.errors, run.errors)
    write_json(outputs.stats, stats)
    write_jsonl(outputs.responses, ordered)
    return stats


def _journaled(done: dict[str, dict], prompt: Prompt) -> bool:
    """Whether a prompt is finished: its record, or every turn of a trajectory (or those up to the one that did
    not fit the context), journaled for this content."""
    if prompt.history is not None:
        records = _turn_records(done, prompt)
        return len(records) == len(prompt.turns) or (bool(records) and records[-1]["status"] == "dropped_context")
    record = done.get(prompt.id)
    return record is not None and record["prompt_hash"] == prompt.digest


def turn_id(prompt_id: str, k: int) -> str:
    """A trajectory turn's record id."""
    return f"{prompt_id}#{k}"


def _turn_records(done: dict[str, dict], prompt: Prompt) -> list[dict]:
    """A trajectory's journaled turn records, in order, up to its first turn not journaled for this content."""
    records = []
    for k in range(len(prompt.turns)):
        record = done.get(turn_id(prompt.id, k))
        if record is None or record["prompt_hash"] != prompt.digest:
            break
        records.append(record)
    return records


def _records_of(done: dict[str, dict], prompt: Prompt) -> list[dict]:
    """A prompt's journaled records: its own, or a trajectory's turns journaled so far."""
    if prompt.history is not None:
        return _turn_records(done, prompt)
    return [done[prompt.id]] if _journaled(done, prompt) else []


def _resume(prompts: list[Prompt], journal: Journal) -> _Run:
    """State of a run that starts from what the journal already holds (for these prompts only): a trajectory
    counts once finished, its turns' tokens as journaled. A row journaled ``setup_failed`` (its instances not set
    up, which the version before journaled as final) is not finished: it is sent again."""
    run = _Run(done={k: r for k, r in journal.load().items() if r["status"] != SETUP_FAILED})
    for prompt in prompts:
        ok = [r for r in _records_of(run.done, prompt) if r["status"] == "ok"]
        run.kept += bool(ok) and _journaled(run.done, prompt)
        run.completion_tokens += sum(r["usage"]["completion_tokens"] for r in ok)
    return run


def has_work(prompts: list[Prompt], journal_path: Path, max_samples: int | None, token_budget: int | None) -> bool:
    """Whether a run would send anything, so a finished dataset does not start a server."""
    run = _resume(prompts, Journal(journal_path, 1))
    if all(_journaled(run.done, p) for p in prompts):
        return False
    return not Limits(max_samples, token_budget).reached(run)


def _bar_total(n: int, max_samples: int | None, token_budget: int | None) -> int:
    if token_budget:
        return token_budget
    return min(n, max_samples) if max_samples else n


def _check_error_fraction(dataset: str, prompts: list[Prompt], run: _Run, max_fraction: float,
                          resume_hint: str) -> None:
    """Fail when too many of the dataset's prompts that were tried have no answer."""
    tried = len(run.errors) + sum(_journaled(run.done, p) for p in prompts)
    if not run.errors or len(run.errors) <= max_fraction * tried:
        return
    by_class = Counter(e["error_class"] for e in run.errors)
    first = run.errors[0]
    raise GenerationFailed(
        f"{dataset}: {len(run.errors)} of {tried} prompts failed ({len(run.errors) / tried:.1%}, above "
        f"max_error_fraction {max_fraction:.1%}); by class: {dict(by_class)}; first: {first['id']}: "
        f"{first['error_class']}: {first['message']}; no output was written; {resume_hint} and retries only "
        "the failed prompts")


async def _watch_server(server_exit: Callable[[], str | None], run: _Run, stop: asyncio.Event) -> None:
    while not stop.is_set():
        message = server_exit()
        if message:
            run.fatal = message
            stop.set()
            return
        await asyncio.sleep(1.0)


async def _launch_all(todo: list[Prompt], client, settings: GenerationSettings, journal: Journal, run: _Run, bar,
                      stop: asyncio.Event, limits: Limits,
                      early_check: Callable[[list[dict]], str | None] | None = None,
                      context: ContextLimit | None = None) -> None:
    """Launch prompts in order, at most ``concurrency`` at once, until done, limits reached or stop."""
    tasks: set[asyncio.Task] = set()
    stopper = asyncio.create_task(stop.wait())

    async def wait_some() -> None:
        done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
        for task in done - {stopper}:
            tasks.discard(task)
            try:
                task.result()  # request failures are handled inside _one; this surfaces the rest
            except EndpointsDown as err:
                run.fatal = str(err)
                stop.set()
        if early_check and not run.early_checked and len(run.fresh) >= EARLY_CHECK_ANSWERS:
            run.early_checked = True
            run.fatal = early_check(run.fresh)
            if run.fatal:
                stop.set()

    try:
        for prompt in todo:
            # Wait while the slots are full or the in-flight estimate says the limits are met but
            # the journaled answers do not: the finishing answers decide whether more are needed.
            while not stop.is_set() and tasks and (len(tasks) >= settings.concurrency
                                                   or limits.reached(run, settings.max_tokens)):
                await wait_some()
            if stop.is_set() or limits.reached(run):
                break
            run.in_flight += 1
            tasks.add(asyncio.create_task(_one(prompt, client, settings, journal, run, bar, context, limits)))
        while tasks and not stop.is_set():
            await wait_some()
    finally:
        stopper.cancel()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@dataclass
class _Conversation:
    """One prompt's regeneration so far: the messages, per assistant turn facts, how its tool calls went."""

    messages: list[dict]
    turns: list[dict] = field(default_factory=list)
    tool_calls: int = 0
    cut: str | None = None
    ends_at_call: bool = False
    fewer_calls: bool = False
    results_by_name: int = 0
    unparsed_markup: int = 0  # turns whose text holds the parser's call markup and no call was read
    ends_at_context: bool = False  # the next request's prompt would not fit the target's context
    executed_steps: int = 0  # turns of calls run on the row's own instances (unmatched_calls: execute)
    execution_errors: Counter = field(default_factory=Counter)  # their calls' errors, by reason (bfcl.Instances.run)
    cost: float = 0.0

    def end_at_context(self) -> _Conversation:
        """End before a request that would not fit: what was to be sent after the last answer (a user turn, tool
        results) is dropped, so the conversation ends at the model's last turn."""
        answered = max((i for i, m in enumerate(self.messages) if m["role"] == "assistant"), default=-1)
        del self.messages[answered + 1:]
        self.ends_at_context = True
        return self


Ask = Callable[[list[dict]], Awaitable[ChatResult]]


def _unmatched_mode(prompt: Prompt, settings: GenerationSettings) -> str:
    """What a call no result answers gets: the set's ``unmatched_calls``, else ``execute`` for a row with an
    environment (BFCL multi-turn) and ``cut`` for any other."""
    return settings.unmatched_calls or ("execute" if prompt.environment is not None else "cut")


async def converse(prompt: Prompt, ask_turn: Ask, settings: GenerationSettings,
                   context: ContextLimit | None = None, end_at_length: bool = True) -> _Conversation:
    """Answer a prompt turn by turn on the model's own history (``ask_turn`` sends one request); within each user
    turn's stretch, answer the model's tool calls until it answers in text. Calls are paired with the dataset's
    results (each stretch loops at most once per dataset step, plus the answer that ends it) until one cannot be
    paired or the data ends at a call; under ``execute`` every call runs on the row's own instances, set up once
    for the row, up to BFCL's step limit per stretch (the call turn past it ends the conversation, counted
    ``step_limit``; one after a call that timed out, ``call_timeout``). Generation and the serving grid drive
    this one loop; the grid keeps a conversation going past an answer cut by ``max_tokens`` (``end_at_length``
    False: its load is the set's turns, not a row to keep).
    Raises :class:`bfcl.SetupFailed` for a row whose instances cannot be set up (:func:`generate` refuses
    ``execute`` for a set whose rows have no environment before any request)."""
    mode = _unmatched_mode(prompt, settings)
    instances = bfcl.Instances(prompt.environment) if mode == "execute" else None
    try:
        return await _converse(prompt, ask_turn, settings, context, mode, instances, end_at_length)
    finally:
        if instances is not None:
            instances.close()


async def _converse(prompt: Prompt, ask_turn: Ask, settings: GenerationSettings, context: ContextLimit | None,
                    mode: str, instances: bfcl.Instances | None, end_at_length: bool) -> _Conversation:
    conv = _Conversation([{"role": "system", "content": prompt.system}] if prompt.system else [])
    stretches = prompt.tool_steps or []
    markup = call_markup(settings.tool_call_parser, settings.tool_rendering) if prompt.tools else ()
    limit = bfcl.step_limit() if instances else 0
    for index, turn in enumerate(prompt.turns):
        conv.messages.append({"role": "user", "content": turn})
        steps = list(stretches[index]) if index < len(stretches) else []
        executed = 0
        while True:
            sent = history_reasoning(conv.messages, settings.reasoning)
            if context and context.leaves_no_room(sent, prompt.tools):
                return conv.end_at_context()
            result = await ask_turn(sent)
            conv.cost += result.cost or 0.0
            conv.messages.append(assistant_message(result, settings.tool_rendering == "text"))
            conv.turns.append(_turn_record(result))
            conv.tool_calls += len(result.tool_calls or [])
            conv.unparsed_markup += not result.tool_calls and any(m in (result.content or "") for m in markup)
            if result.finish_reason == "length" and end_at_length:
                return conv
            if not result.tool_calls:
                conv.fewer_calls |= bool(steps) and instances is None
                break
            if instances is not None:
                if executed == limit:
                    conv.cut = "step_limit"
                    return conv
                if instances.abandoned:  # an earlier call timed out, its thread may still change the instances
                    conv.cut = "call_timeout"
                    return conv
                conv.messages += await _executed(result.tool_calls, instances, conv)
                executed += 1
                continue
            pairing = pair_calls(result.tool_calls, steps, prompt.tools, mode,
                                 data_ends_here=prompt.open_end and index == len(prompt.turns) - 1)
            conv.cut, conv.ends_at_call = pairing.cut, pairing.ends_at_call
            conv.results_by_name += pairing.by_name
            if conv.cut or conv.ends_at_call:
                return conv
            conv.messages += pairing.answers
    return conv


async def _executed(calls: list[dict], instances: bfcl.Instances, conv: _Conversation) -> list[dict]:
    """One step: the turn's calls run in the order made, each in a thread of its own, answered with its result or
    BFCL's error text (a call past :data:`bfcl.CALL_TIMEOUT_S`: a timeout error, counted ``timeout``; the turn's
    later calls are then not run on the abandoned instances, counted ``not_run``). The target sees the errors; its
    next call ends the conversation (``call_timeout``)."""
    answers = []
    for call in calls:
        if instances.abandoned:
            text, error = f"{bfcl.EXECUTION_ERROR}not run: an earlier call of the turn timed out", "not_run"
        else:
            text, error = await instances.run_bounded(call)
        if error:
            conv.execution_errors[error] += 1
        answers.append({"role": "tool", "tool_call_id": call["id"], "name": call["function"]["name"],
                        "content": text})
    conv.executed_steps += 1
    return answers


async def ask(client: ChatClient, messages: list[dict], prompt: Prompt, body: dict, tool_rendering: str) -> ChatResult:
    """The request for the conversation so far: the prompt's tools as the API's field, or rendered as text
    (``tool_rendering``); generation and the serving grid ask alike."""
    if not prompt.tools:
        return await client.chat(messages, body)
    if tool_rendering == "text":
        return await client.chat(text_rendering(messages, prompt.tools), body,
                                 text_tool_calls=parse_text_tool_calls)
    return await client.chat(messages, body, tools=prompt.tools)


def assistant_message(result: ChatResult, as_text: bool) -> dict:
    """The answer as the history holds it. Rendered as text, the calls stay in the content as the model
    wrote them (``text_rendering`` of the record is then what was sent), so no ``tool_calls`` key."""
    answer: dict[str, Any] = {"role": "assistant", "content": result.content}
    if result.reasoning:
        answer["reasoning"] = result.reasoning
    if result.tool_calls and not as_text:
        answer["tool_calls"] = result.tool_calls
    return answer


async def _one(prompt: Prompt, client: ChatClient, settings: GenerationSettings, journal: Journal, run: _Run,
               bar: tqdm, context: ContextLimit | None = None, limits: Limits | None = None) -> None:
    run.prompts_this_run += 1
    try:
        if prompt.history is not None:
            await _trajectory(prompt, client, settings, journal, run, bar, context, limits)
            return
        begun = time.monotonic()
        body = settings.request_body()
        try:
            conv = await converse(prompt, lambda sent: ask(client, sent, prompt, body, settings.tool_rendering),
                                  settings, context)
        except RequestFailed as failed:
            _failed(run, prompt.id, failed)
            return
        except bfcl.SetupFailed as failed:  # the wheel's or the machine's state, not the row's: tried again
            log.warning("%s: its tool instances could not be set up (%s); not regenerated", prompt.id, failed)
            run.errors.append({"id": prompt.id, "error_class": SETUP_FAILED, "message": str(failed), "attempts": 1})
            return
        run.cost += conv.cost
        record = _record(prompt, conv, settings, round(time.monotonic() - begun, 3))
        _journal(record, journal, run, bar)
        run.kept += record["status"] == "ok"
    finally:
        run.in_flight -= 1


def _failed(run: _Run, record_id: str, failed: RequestFailed) -> None:
    run.errors.append({"id": record_id, "error_class": failed.error_class, "message": failed.message,
                       "attempts": failed.attempts})
    log.warning("%s failed: %s", record_id, failed)


def _journal(record: dict, journal: Journal, run: _Run, bar: tqdm) -> None:
    """Journal a finished record and count its tokens (the budget's unit)."""
    journal.append(record)
    run.done[record["id"]] = record
    if record["status"] != "ok":
        return
    tokens = record["usage"]["completion_tokens"]
    if len(run.fresh) < EARLY_CHECK_ANSWERS:
        run.fresh.append(record)
    run.completion_tokens += tokens
    run.tokens_this_run += tokens
    if bar.unit == "tok" or "trajectory" not in record:
        bar.update(tokens if bar.unit == "tok" else 1)
    elapsed = max(time.monotonic() - run.started, 1e-6)
    bar.set_postfix(rec=run.kept, req_s=f"{run.prompts_this_run / elapsed:.2f}",
                    tok_s=f"{run.tokens_this_run / elapsed:.0f}", refresh=False)


def history_messages(prompt: Prompt, k: int, tool_rendering: str = "template") -> list[dict]:
    """The context of a trajectory's turn ``k``: the dataset's conversation up to that user turn; an OpenHands
    trajectory's calls and results as structure where the template renders calls (:func:`calls_as_structure`)."""
    messages = [{"role": "system", "content": prompt.system}] if prompt.system else []
    for j, turn in enumerate(prompt.turns[: k + 1]):
        messages.append({"role": "user", "content": turn})
        if j < k:
            messages.append({"role": "assistant", "content": prompt.history[j]})
    if calls_as_structure(prompt, tool_rendering):
        return agent_shapes.openhands_messages(messages, prompt.tools)
    return messages


def calls_as_structure(prompt: Prompt, tool_rendering: str) -> bool:
    """Whether a trajectory's calls written as text are sent as calls, with its tools: where it has tools and
    the template renders calls. Otherwise they stay the text the system prompt describes, and no tools are
    sent (``tool_rendering: text`` would describe them a second time)."""
    return prompt.calls == "openhands" and bool(prompt.tools) and tool_rendering == "template"


async def _trajectory(prompt: Prompt, client: ChatClient, settings: GenerationSettings, journal: Journal, run: _Run,
                      bar: tqdm, context: ContextLimit | None, limits: Limits | None = None) -> None:
    """Answer a trajectory's turns not journaled yet, in order, each on the dataset's history; a turn that does
    not fit ends it (journaled as ``dropped_context``), a failed one stops it until the next run."""
    ok = [r for r in _turn_records(run.done, prompt) if r["status"] == "ok"]
    first = len(_turn_records(run.done, prompt))
    sent = prompt if calls_as_structure(prompt, settings.tool_rendering) else replace(prompt, tools=None)
    for k in range(first, len(prompt.turns)):
        if k > first and limits and limits.token_budget is not None and run.completion_tokens >= limits.token_budget:
            break  # the budget is spent: no further turn (those answered are rows; a larger budget resumes here)
        begun = time.monotonic()
        conv = _Conversation(history_messages(prompt, k, settings.tool_rendering))
        body = settings.request_body()
        try:
            # the turn's row is its prefix and its answer, cut at the context (for these rows tokenize.max_length):
            # an answer past it would be generated and cut away, so none is asked for
            room = (context.answer_room(conv.messages, sent.tools, body["max_tokens"]) if context
                    else body["max_tokens"])
            body = body if room >= body["max_tokens"] else {**body, "max_tokens": room}
            result = await ask(client, conv.messages, sent, body, settings.tool_rendering) if room else None
        except RequestFailed as failed:  # a template that cannot render the turn is that turn's error too
            _failed(run, turn_id(prompt.id, k), failed)
            return
        if result is not None:
            run.cost += result.cost or 0.0
            conv.messages.append(assistant_message(result, False))
            conv.turns.append(_turn_record(result))
        record = _record(sent, conv, settings, round(time.monotonic() - begun, 3)) | {"prompt_hash": prompt.digest}
        record |= {"id": turn_id(prompt.id, k), "trajectory": prompt.id, "turn": k}
        if conv.turns:
            record["supervise"] = "last"
        _journal(record, journal, run, bar)
        ok += [record] if record["status"] == "ok" else []
        if not conv.turns:
            break
    run.kept += bool(ok)
    if ok and bar.unit != "tok":
        bar.update(1)  # the bar counts trajectories, as max_samples does


def _record(prompt: Prompt, conv: _Conversation, settings: GenerationSettings, latency_s: float) -> dict:
    """The journal's record of a finished conversation. A row with tools also keeps its tools, its
    call count, its cut or its end at a call (each absent when none), whether it ended with fewer calls
    than the dataset, and where they happened, the calls answered by name alone (``results_by_name``:
    semi-on-policy) and the turns whose text held call markup no parser read."""
    turns = conv.turns
    if not turns:  # its first request did not fit the context: nothing of the model's to keep
        return {"format": RECORD_FORMAT, "id": prompt.id, "prompt_hash": prompt.digest, "status": "dropped_context",
                "latency_s": latency_s}
    finish_reasons = [t["finish_reason"] for t in turns]
    truncated = "length" in finish_reasons
    status = "dropped_truncated" if truncated and settings.finish_reason_policy == "drop" else "ok"
    usage = {"prompt_tokens": sum(t["prompt_tokens"] for t in turns),
             "completion_tokens": sum(t["completion_tokens"] for t in turns)}
    record = {"format": RECORD_FORMAT, "id": prompt.id, "prompt_hash": prompt.digest,
              "status": status, "messages": conv.messages, "finish_reason": finish_reasons[-1],
              "finish_reasons": finish_reasons, "usage": usage, "turns": turns, "latency_s": latency_s}
    if settings.finish_reason_policy == "mark":
        record["truncated"] = truncated
    if conv.ends_at_context:
        record["ends_at_context"] = True
    if prompt.tools or prompt.tool_steps:
        # without the server's token ids, the tokenize stage's template renders the calls
        record |= {"tools": prompt.tools, "tool_calls": conv.tool_calls, "fewer_calls": conv.fewer_calls,
                   "tool_call_tokens": "model" if all("token_ids" in t for t in turns) else "template"}
        if settings.tool_rendering != "template":
            record["tool_rendering"] = settings.tool_rendering
        if conv.cut:
            record["cut"] = conv.cut
        if conv.ends_at_call:
            record["ends_at_call"] = True
        if conv.results_by_name:
            record["results_by_name"] = conv.results_by_name
        if conv.unparsed_markup:
            record["unparsed_call_markup"] = conv.unparsed_markup
    if prompt.environment is not None:
        record["calls_expected"] = bfcl.expected_calls(prompt.environment)
    if conv.executed_steps:
        record["executed_steps"] = conv.executed_steps
    if conv.execution_errors:
        record["execution_errors"] = dict(conv.execution_errors)
    return record


def _turn_record(result) -> dict:
    """Per-turn facts the tokenize stage checks against: what the server counted and produced."""
    turn = {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens,
            "finish_reason": result.finish_reason}
    if result.prompt_token_ids is not None:
        turn["prompt_ids_digest"] = ids_digest(result.prompt_token_ids)
    if result.token_ids is not None:
        turn["token_ids"] = result.token_ids
    return turn


def _warn_parser(dataset: str, stats: dict) -> None:
    """A turn whose text holds the parser's own call markup but no call was read: the target called a tool
    and the endpoint's parser (another one, or none) did not read it, so the conversation went on as if it had
    answered. The job says so, not only the report. Cuts and ends at a call are the target's choices: counted."""
    if stats["unparsed_call_markup"]:
        log.warning("%s: %d of %d conversations with tools hold a turn whose text has the tool-call parser's markup "
                    "and no call was read from it: check target.tool_call_parser (with tokenize.tool_rendering: "
                    "text, the model wrote blocks that are not a JSON call)", dataset,
                    stats["unparsed_call_markup"], stats["rows_with_tools"])


def _log_executed(dataset: str, stats: dict) -> None:
    """The job's log says how the rows' own calls ran, and names every row whose instances were not set up."""
    if "executed_steps" not in stats:
        return
    log.info("%s: %d steps run on the rows' own instances, %d calls made against %d in the ground truth, execution "
             "errors %s", dataset, stats["executed_steps"], stats["calls_made"], stats["calls_expected"],
             stats["execution_errors_by_reason"] or "none")
    if stats["setup_failed"]:
        log.warning("%s: %d rows whose tool instances could not be set up were not regenerated (errors: the next "
                    "run tries them again): %s", dataset, stats["setup_failed"], ", ".join(stats["setup_failed_ids"]))


def _stats(dataset, prompts, run: _Run, client: ChatClient | None, wall_s, limits: Limits,
           settings: GenerationSettings) -> dict:
    records = [r for p in prompts for r in _records_of(run.done, p)]
    ok = [r for r in records if r["status"] == "ok"]
    trajectories = [p for p in prompts if p.history is not None and _records_of(run.done, p)]
    ended_at_context = sum(_records_of(run.done, p)[-1]["status"] == "dropped_context" for p in trajectories)
    lat = sorted(r["latency_s"] for r in ok)
    return {
        "dataset": dataset,
        "prompts_available": len(prompts),
        "records": len(ok),
        **({"trajectories": len(trajectories), "trajectories_ended_at_context": ended_at_context}
           if trajectories else {}),
        "dropped_truncated": sum(r["status"] == "dropped_truncated" for r in records),
        "dropped_context": sum(r["status"] == "dropped_context" for r in records),
        "ends_at_context": sum("ends_at_context" in r for r in ok),
        "truncated_kept": sum("length" in r["finish_reasons"] for r in ok),
        "reasoning_records": sum(any("reasoning" in m for m in r["messages"]) for r in ok),
        "rows_with_tools": sum("tool_calls" in r for r in ok),
        "tool_calls": sum(r.get("tool_calls", 0) for r in ok),
        "cuts_by_reason": dict(Counter(r["cut"] for r in ok if "cut" in r)),
        "ends_at_call": sum("ends_at_call" in r for r in ok),
        "fewer_calls": sum(bool(r.get("fewer_calls")) for r in ok),
        "results_by_name": sum(r.get("results_by_name", 0) for r in ok),
        "unparsed_call_markup": sum("unparsed_call_markup" in r for r in ok),
        **_executed_stats(ok, run.errors),
        "tool_call_token_source": dict(Counter(r["tool_call_tokens"] for r in ok if "tool_call_tokens" in r)),
        "errors": len(run.errors),
        "errors_by_class": dict(Counter(e["error_class"] for e in run.errors)),
        "max_error_fraction": settings.max_error_fraction,
        "retries": client.stats.retries if client else 0,
        "retries_by_class": client.stats.retries_by_class if client else {},
        "requests_by_endpoint": client.requests_by_endpoint if client else [],
        "prompt_tokens": sum(r["usage"]["prompt_tokens"] for r in ok),
        "completion_tokens": sum(r["usage"]["completion_tokens"] for r in ok),
        "max_samples": limits.max_samples,
        "token_budget": limits.token_budget,
        "prompts_sent_this_run": run.prompts_this_run,
        "latency_p50_s": statistics.median(lat) if lat else None,
        "latency_p95_s": lat[min(len(lat) - 1, int(0.95 * len(lat)))] if lat else None,
        "wall_s_this_run": round(wall_s, 3),
        "cost": run.cost or None,
    }


def _executed_stats(ok: list[dict], failures: list[dict]) -> dict:
    """For a set with environments (BFCL multi-turn): the steps and calls run on the rows' own instances, the calls
    the ground truth made, the calls' errors by reason, the rows whose set-up failed this run (named; errors, so
    tried again by the next run); none otherwise."""
    failed = sorted(e["id"] for e in failures if e["error_class"] == SETUP_FAILED)
    with_env = [r for r in ok if "calls_expected" in r]
    if not with_env and not failed:
        return {}
    errors: Counter = Counter()
    for r in with_env:
        errors.update(r.get("execution_errors", {}))
    return {"executed_steps": sum(r.get("executed_steps", 0) for r in with_env),
            "calls_made": sum(r.get("tool_calls", 0) for r in with_env),
            "calls_expected": sum(r["calls_expected"] for r in with_env),
            "execution_errors_by_reason": dict(errors), "setup_failed": len(failed), "setup_failed_ids": failed}


def make_client(base_urls: str | list[str], model: str, settings: GenerationSettings, api_key_env: str | None,
                headers: dict[str, Any] | None, health: HealthPolicy | None = None,
                max_retry_after_s: float = 600.0) -> ChatClient:
    """Secrets (the API key, header values given as ``{env: NAME}``) come from the environment only."""
    api_key = _from_env(api_key_env, "generation_server.api_key_env") if api_key_env else None
    resolved = {name: _from_env(value["env"], f"generation_server.headers.{name}") if isinstance(value, dict) else value
                for name, value in (headers or {}).items()}
    return ChatClient(base_urls, model, api_key=api_key, headers=resolved,
                      request_timeout_s=settings.request_timeout_s, connect_timeout_s=settings.connect_timeout_s,
                      retry=RetryPolicy(max_attempts=settings.max_attempts, max_retry_after_s=max_retry_after_s),
                      health=health, max_connections=settings.concurrency)


def _from_env(name: str, key: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise ValueError(f"environment variable {name} ({key}) is not set")
    return value
