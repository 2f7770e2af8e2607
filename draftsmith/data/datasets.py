"""Read prompt sets into one shape: ``{"id": str, "turns": [user message, ...]}`` (plus a system prompt).

Accepted files: ``.jsonl``, ``.jsonl.gz``, ``.json`` (a list of rows) and ``.parquet``; a source
may also be ``package:<module>/<path>`` for a file that a PyPI package installs, or
``hf:<dataset id or folder>[@<split>]`` for anything ``datasets.load_dataset`` reads (a hub id
needs a machine that is online; the split defaults to ``train``). Row shapes:
OpenAI ``messages``, ShareGPT ``conversations`` (from/value), ``turns`` (user turns only, as in
MT-bench), or a plain prompt column. A row that cannot be read is a :class:`Reject` naming the
file, row number and field, never a silent drop.

Rows with tools: a ``tools`` column (function schemas, as a list or a JSON string; bare
``{name, description, parameters}`` are wrapped as OpenAI's ``{"type": "function", ...}``), and
calls with their results: OpenAI assistant ``tool_calls`` (or ``function_call``) answered by
``tool`` (or ``function``) messages, paired by ``tool_call_id`` or else in order; ShareGPT
``function_call`` / ``tool_call`` turns (one call or a JSON list of parallel ones) answered by
``observation`` / ``tool_response`` / ``function`` / ``tool`` turns, in order (one observation may
hold a JSON list of the results of n parallel calls). The dataset's calls are regenerated like its
answers; their results, each with its call's name and arguments, are kept as :attr:`Prompt.tool_steps`
for generation to pair with the model's own calls. A row with calls and no tools is refused, unless the set
gives its tools (``datasets.<name>.tools``): generation would send none.

Agent sets in the shapes they are published in (``format: glaive``, ``hermes``, ``xlam``, ``sweagent``,
``openhands``; detected under ``auto`` where their keys leave no doubt) are read by
:mod:`draftsmith.data.agent_shapes` and paired here.

Trajectories regenerated on their own history (``generation.history: dataset``, the default of ``sweagent`` and
``openhands``): the
row keeps the dataset's assistant turns (:attr:`Prompt.history`), so that each turn is answered on the context it
had. Such a row alternates user and assistant turns and has no tool calls: its actions stay text. An OpenHands
export's actions are calls written as text (``<function=...>``): its row keeps them so (:attr:`Prompt.calls`) with
the tools, the export's own ``tools`` where it has them, else the set's; generation reads them as calls where the
target's template renders calls. An OpenHands export with function calling (a ``trajectory`` of OpenAI messages
with ``tool_calls``) is read as the same text (:func:`draftsmith.data.agent_shapes.openhands`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from draftsmith.config.target import resolve_package_file
from draftsmith.core import jsonl
from draftsmith.core.digest import prompt_digest
from draftsmith.data import agent_shapes
from draftsmith.data.tool_calls import call_arguments

CHAT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}
# Where a tool call or result stands: OpenAI's messages hold calls in assistant turns, ShareGPT's in turns of their own.
OPENAI_ROLES = {**CHAT_ROLES, "tool": "result", "function": "result"}
SHAREGPT_ROLES = {**CHAT_ROLES, "function_call": "call", "tool_call": "call", "observation": "result",
                  "tool_response": "result", "function": "result", "tool": "result"}


# The workloads whose prompts carry tools: their jobs depend on how the tools reach the target.
TOOL_WORKLOADS = ("tools", "agent")


def tool_params(config: dict, workloads: list[str]) -> dict[str, Any]:
    """The tool settings a job's results depend on (its params): where one of its prompt sets is a tool workload,
    the target's tool-call parser and how the tools are rendered, each only where set. A chat or code set, and a
    project that sets neither, keep their params, so adding a tool set reruns nothing else."""
    if not any(w in TOOL_WORKLOADS for w in workloads):
        return {}
    settings = {"tool_call_parser": config["target"]["tool_call_parser"],
                "tool_rendering": config["tokenize"]["tool_rendering"]}
    return {k: v for k, v in settings.items() if v not in (None, "template")}


def generation_tool_params(config: dict, workloads: list[str]) -> dict[str, Any]:
    """A generate job's tool settings (:func:`tool_params`), with ``tokenize.reasoning`` where set otherwise than
    its default: a tool stretch's history is sent with the reasoning the rows keep
    (:func:`draftsmith.data.chat.history_reasoning`). A chat set's params, and a tool set's at the default, stay
    as they were."""
    if not any(w in TOOL_WORKLOADS for w in workloads):
        return {}
    reasoning = config["tokenize"]["reasoning"]
    return tool_params(config, workloads) | ({"reasoning": reasoning} if reasoning != "template" else {})


def evaluation_tool_params(config: dict) -> dict[str, Any]:
    """The serving grid's tool settings (its jobs' params): a generate job's (:func:`generation_tool_params`) over
    the evaluation's prompt sets, for the grid sends a tool set's history as generation does. A project with no
    tool set, or at the defaults, keeps its params and measures nothing again."""
    return generation_tool_params(config, [e["workload"] for e in config["evaluation"]["prompt_sets"].values()])


# Generation settings added since projects ran, at their unset value: left out of a job's params (and the run's
# digest) until a project sets them, so that adding one reruns nothing.
ADDED_GENERATION = {"unmatched_calls": None, "history": None}
# The shapes answered on the dataset's history whatever the set says: a trajectory's observations belong to its own
# actions, so answering them after the model's would be a conversation that never happened.
SHAPE_HISTORY = {"sweagent": "dataset", "openhands": "dataset"}


def entry_params(entry: dict) -> dict[str, Any]:
    """A dataset's config entry as its jobs' params: without its workload (a label: relabelling reruns nothing)
    and without a generation setting added since projects ran while it is unset."""
    generation = {k: v for k, v in (entry.get("generation") or {}).items()
                  if not (k in ADDED_GENERATION and v == ADDED_GENERATION[k])}
    return {k: v for k, v in entry.items() if k != "workload"} | ({"generation": generation} if "generation" in entry
                                                                  else {})


# The shape of a tool set's prompt rows (results/prompts/<set>.jsonl), which generation reads back: 2 since each
# result carries its call's arguments and a row says whether its data ends at a call (``open_end``; issue 57). A tool
# set's prompts job takes it as a param (:func:`prompt_rows_params`): its rows written before hold neither, and the
# changed digests would otherwise regenerate the set from them, pairing results by name alone and cutting
# single-turn sets at their calls, the very behaviour the new rows end.
TOOL_ROWS_FORMAT = 2
# A BFCL multi-turn set's rows carry their environment (:attr:`Prompt.environment`) since this format: its prompts
# job takes it as a param, so that rows written before are read again, the target's calls run on their instances.
ENVIRONMENT_ROWS_FORMAT = 1
ENVIRONMENT_SOURCES = ("bfcl:multi_turn_",)


def prompt_rows_params(entry: dict) -> dict[str, Any]:
    """What a dataset's prompts job adds to its params for the shape of the rows it writes: a tool or agent set's
    :data:`TOOL_ROWS_FORMAT` (its prompts are read again once), a BFCL multi-turn set's
    :data:`ENVIRONMENT_ROWS_FORMAT` too, nothing for other sets (theirs stay as they are)."""
    params = {"tool_rows": TOOL_ROWS_FORMAT} if entry.get("workload") in TOOL_WORKLOADS else {}
    return params | environment_rows_params(entry)


def environment_rows_params(entry: dict) -> dict[str, Any]:
    """:data:`ENVIRONMENT_ROWS_FORMAT` for a set whose rows carry an environment (BFCL multi-turn), else nothing:
    its calls run live since then, so its prompts are read again and, as an evaluation set, every window that
    sent it is measured again once (the target alone's too), never a live cell against a baseline of the old loop."""
    return {"environment_rows": ENVIRONMENT_ROWS_FORMAT} if str(entry.get("source", "")).startswith(
        ENVIRONMENT_SOURCES) else {}


def workload_problem(prompts: list[Prompt], workload: str, where: str) -> str | None:
    """A set whose rows have tools must say so (``workload: tools`` or ``agent``): the tool settings enter only
    such a set's jobs (:func:`tool_params`), so a mislabelled one would not be regenerated when they change."""
    with_tools = sum(bool(p.tools) for p in prompts)
    if not with_tools or workload in TOOL_WORKLOADS:
        return None
    return (f"{where}: {with_tools} of its {len(prompts)} prompts have tools but its workload is {workload!r}: "
            "set workload: tools (single requests) or agent (multi-turn, tool results in the context)")


@dataclass(frozen=True)
class Prompt:
    """A prompt as generation sends it.

    ``tools``: OpenAI function schemas (``{"type": "function", "function": {...}}``), sent with every
    request of the row. ``tool_steps``: the dataset's tool results, one list per user turn (the stretch
    up to the next user turn); each stretch is a list of steps, a step being the results of one
    assistant turn's calls in order (``{"name": function name, "arguments": the call's arguments object,
    "content": result text}``; more than one where the dataset made parallel calls). Generation pairs the
    model's calls with them by name and arguments. ``open_end``: a row with tools whose data stops after
    its last call or user turn (no result, no later answer or turn): a single-turn tool set, a prompt
    with tools, a trajectory's end; a conversation ends there at the model's calls, no cut.
    ``history``: the dataset's assistant turns, ``history[k]`` its answer to ``turns[k]``, for a row whose turns
    are each answered on the dataset's conversation up to them (``generation.history: dataset``): one fewer than
    the turns, as the last turn's answer is the model's. None: each turn is answered on the model's own history.
    ``calls``: the markup the dataset's answers write their calls in (``openhands``), read as calls and their
    results where the target's template renders calls (:func:`draftsmith.data.agent_shapes.openhands_messages`);
    None: the answers are text.
    """

    id: str
    turns: list[str]
    system: str | None = None
    tools: list[dict] | None = None
    tool_steps: list[list[list[dict]]] | None = None
    open_end: bool = False
    history: list[str] | None = None
    environment: dict | None = None
    calls: str | None = None

    @property
    def digest(self) -> str:
        return prompt_digest(self.turns, self.system, self.tools, self.tool_steps, self.open_end, self.history,
                             self.environment, self.calls)


@dataclass(frozen=True)
class Reject:
    file: str
    row: int
    field: str
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.file, "row": self.row, "field": self.field, "reason": self.reason}

    def __str__(self) -> str:
        return f"{self.file}: row {self.row}: field {self.field!r}: {self.reason}"


@dataclass
class PromptSet:
    prompts: list[Prompt] = field(default_factory=list)
    rejects: list[Reject] = field(default_factory=list)


def resolve_source(source: str, base_dir: Path) -> Path:
    if source.startswith(("hf:", "bfcl:")):
        return Path(source)  # kept verbatim; iter_rows hands it to datasets.load_dataset or bfcl.rows
    if source.startswith("package:"):
        return resolve_package_file(source)
    path = Path(source)
    return path if path.is_absolute() else base_dir / path


def iter_rows(path: Path) -> Iterator[tuple[int, Any]]:
    """Yield ``(row number, parsed row)``; a line that is not a JSON object yields its JsonlError."""
    name = path.name
    if str(path).startswith("hf:"):
        yield from enumerate(_load_hf(str(path).removeprefix("hf:")), start=1)
    elif str(path).startswith("bfcl:"):
        from draftsmith.data import bfcl

        yield from enumerate(bfcl.rows(str(path).removeprefix("bfcl:")), start=1)
    elif name.endswith(".parquet"):
        import pyarrow.parquet as pq

        yield from enumerate(pq.read_table(path).to_pylist(), start=1)
    elif name.endswith(".json"):
        rows = json.loads(path.read_text(encoding="utf-8-sig"))
        if not isinstance(rows, list):
            raise ValueError(f"{path}: a .json prompt file must hold a list of rows")
        yield from enumerate(rows, start=1)
    elif name.endswith((".jsonl", ".jsonl.gz")):
        yield from jsonl.lines(path)
    else:
        raise ValueError(f"{path}: unsupported prompt file type (use .jsonl, .jsonl.gz, .json or .parquet)")


def hub_id(source: str) -> str | None:
    """The hub id of a dataset source (``hf:org/name@split``); None for a local file, a package's,
    or an ``hf:`` folder on this disk (read as :func:`_load_hf` reads it, from the job's folder)."""
    if not source.startswith("hf:"):
        return None
    dataset_id = source.removeprefix("hf:").partition("@")[0]
    return None if Path(dataset_id).exists() else dataset_id


def _load_hf(spec: str):
    """A ``datasets.save_to_disk`` folder, a folder of data files, or a hub id: from the local
    Hugging Face cache when it holds a snapshot (what ``hf download --repo-type dataset`` or an
    earlier online run left there), else downloaded (online machines only)."""
    from datasets import load_dataset, load_from_disk

    dataset_id, _, split = spec.partition("@")
    split = split or "train"
    try:
        folder = Path(dataset_id)
        if (folder / "dataset_info.json").is_file() or (folder / "dataset_dict.json").is_file():
            loaded = load_from_disk(dataset_id)
            return loaded[split] if hasattr(loaded, "keys") else loaded
        if not folder.exists():
            cached = _hub_snapshot(dataset_id)
            if cached is not None:
                return load_dataset(cached, split=split)
        return load_dataset(dataset_id, split=split)
    except Exception as err:  # offline, unknown id, missing split: say which source failed
        raise ValueError(f"hf:{spec}: cannot load with datasets.load_dataset ({type(err).__name__}: {err})") from None


def _hub_snapshot(dataset_id: str) -> str | None:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return snapshot_download(dataset_id, repo_type="dataset", local_files_only=True)
    except (LocalEntryNotFoundError, ValueError):
        return None


def parse_row(row: Any, fmt: str, prompt_field: str, max_prompt_chars: int,
              set_tools: list[dict] | None = None, history: str | None = None) -> Prompt:
    """The row as a :class:`Prompt` without its id; raise ``_BadField`` naming what is wrong.
    ``set_tools``: the set's tools (``datasets.<name>.tools``), for its rows that carry none. ``history``: the
    set's ``generation.history`` (None: the shape's default; ``refused``: a set that is not regenerated, where a
    trajectory cannot run, refuses it with :class:`agent_shapes.ShapeNotBuilt`)."""
    if not isinstance(row, dict):
        raise _BadField("<row>", f"expected an object, got {type(row).__name__}")
    if fmt == "auto":
        fmt = _detected_format(row, prompt_field)
    if history == "refused" and fmt in SHAPE_HISTORY:
        raise agent_shapes.ShapeNotBuilt(f"a trajectory (format: {fmt}) is regenerated on its own history, which "
                                         "only a training dataset does: the evaluation grid does not run trajectory "
                                         "sets")
    if (history or SHAPE_HISTORY.get(fmt)) == "dataset":
        parsed = _history_prompt(row, fmt, prompt_field, set_tools)
    elif fmt in agent_shapes.SHAPES:
        parsed = _shape_prompt(row, fmt)
    elif fmt in ("prompt", "turns"):
        if fmt == "prompt":
            turns = [_text(row, prompt_field)]
        else:
            value = row.get("turns")
            if not isinstance(value, list) or not value:
                raise _BadField("turns", "expected a non-empty list of strings")
            turns = [_text({"turns": t}, "turns") for t in value]
        tools = _tools(row.get("tools"))  # user turns only: tools to call, no results of the dataset's
        parsed = Prompt("", turns, None, tools, [[] for _ in turns] if tools else None, bool(tools))
    elif fmt in ("messages", "conversations"):
        parsed = _chat_turns(row, fmt)
    else:
        raise ValueError(f"unknown prompt format {fmt!r}")
    parsed = parsed if parsed.history is not None else _with_set_tools(parsed, set_tools)
    for turn in parsed.turns:
        if len(turn) > max_prompt_chars:
            raise _BadField(_text_field(row, fmt, prompt_field),
                            f"prompt is {len(turn)} characters, over the limit of {max_prompt_chars}")
    return parsed


# Where a shape's user text sits, for a reject that names the field
SHAPE_TEXT_FIELDS = {"glaive": "chat", "hermes": "conversations", "xlam": "query", "sweagent": "trajectory",
                     "openhands": "messages"}


def _text_field(row: dict, fmt: str, prompt_field: str) -> str:
    """The raw field a row's prompts were read from, for a reject that names it."""
    if fmt == "prompt":
        return prompt_field
    return agent_shapes.openhands_key(row) if fmt == "openhands" else SHAPE_TEXT_FIELDS.get(fmt, fmt)


def _detected_format(row: dict, prompt_field: str) -> str:
    """``format: auto``: the chat shapes by their keys, then a published agent shape where its keys leave no
    doubt and the row has no prompt column (an explicit ``prompt_field`` wins), else the prompt column. A
    ShareGPT row holding Hermes markup is refused rather than read either way silently: as chat it would lose
    its tools, and read as Hermes a set loaded before would change its digests. So is an OpenAI row holding
    OpenHands' ``<function=`` calls (as chat, its actions would be answered on the model's own history)."""
    fmt = next((f for f in ("messages", "conversations", "turns") if f in row), None)
    if fmt == "conversations" and agent_shapes.hermes_markup(row["conversations"]):
        raise _BadField("conversations", "holds Hermes tool markup (<tools> / <tool_call> text): set format: hermes "
                                         "to read its tools and calls, or format: conversations to read it as chat")
    if fmt == "messages" and agent_shapes.openhands_markup(row["messages"]):
        raise _BadField("messages", "holds OpenHands calls as text (<function=...>): set format: openhands to "
                                    "regenerate it on its own history, or format: messages to read it as chat")
    if fmt is None and prompt_field not in row:
        fmt = agent_shapes.detect(row)
    return fmt or "prompt"


def _shape_prompt(row: dict, shape: str) -> Prompt:
    """A published agent shape (:mod:`draftsmith.data.agent_shapes`), its calls and results paired as a chat
    row's are."""
    try:
        read = agent_shapes.read(row, shape)
    except agent_shapes.BadShape as bad:
        raise _BadField(bad.field_name, bad.reason) from None
    try:
        tools = _tools(read.tools)
    except _BadField as bad:
        where = bad.field_name if read.tools_where == "tools" else f"{read.tools_where} ({bad.field_name})"
        raise _BadField(where, bad.reason) from None
    turns: list[str] = []
    steps = _Steps()
    for turn in read.turns:
        if turn.role == "user":
            turns.append(_text({"text": turn.text}, "text", where=turn.where))
            steps.user()
        elif turn.role == "assistant":
            steps.assistant([], turn.where)
        elif turn.role == "call":
            steps.assistant(_sharegpt_calls(turn.calls, turn.where), turn.where)
        else:
            steps.result(None, _result_text(turn.text, turn.where), turn.where)
    if not turns:
        raise _BadField(SHAPE_TEXT_FIELDS[shape], "no user message")
    tool_steps = steps.done() if tools is not None or steps.saw_calls else None
    return Prompt("", turns, read.system, tools, tool_steps, tool_steps is not None and steps.open_end)


def _history_prompt(row: dict, fmt: str, prompt_field: str, set_tools: list[dict] | None = None) -> Prompt:
    """A row whose turns are each answered on the dataset's conversation up to them: its user turns and the
    dataset's assistant turns, alternating from a user turn. The dataset's last answer is not kept: the model
    gives its own. Tool calls are refused (a trajectory's actions are text), but for an OpenHands export's,
    which are text until generation reads them (:func:`_openhands_prompt`)."""
    if fmt in agent_shapes.SHAPES:
        try:
            read = agent_shapes.read(row, fmt)
        except agent_shapes.BadShape as bad:
            raise _BadField(bad.field_name, bad.reason) from None
        system, spoken = read.system, [(t.role, t.text, t.where) for t in read.turns]
    elif fmt in ("messages", "conversations"):
        system, spoken = _spoken(row, fmt)
    else:
        raise _BadField(prompt_field if fmt == "prompt" else fmt, f"generation.history: dataset needs a conversation "
                                                                  f"with the dataset's answers; format {fmt} has none")
    turns: list[str] = []
    history: list[str] = []
    for role, text, where in spoken:
        expected = "user" if len(turns) == len(history) else "assistant"
        if role != expected:
            raise _BadField(where, f"a {role} turn where the {expected} turn was due: generation.history: dataset "
                                   "reads alternating user and assistant turns, from a user turn, without tool calls")
        if role == "user":
            turns.append(_text({"text": text}, "text", where=where))
        elif not isinstance(text, str):  # the context of the next turn: what the dataset's model answered
            raise _BadField(where, "missing" if text is None else f"expected a string, got {type(text).__name__}")
        else:
            history.append(text)
    if not turns:
        raise _BadField(fmt, "no user message")
    parsed = Prompt("", turns, system, history=history[: len(turns) - 1])
    return _openhands_prompt(parsed, read, set_tools) if fmt == "openhands" else parsed


def _openhands_prompt(parsed: Prompt, read: agent_shapes.Shape, set_tools: list[dict] | None) -> Prompt:
    """An OpenHands trajectory with its tools: the export's ``tools`` where it has them (the functions it was
    given, as structure), else the set's (``datasets.<name>.tools``); neither leaves its calls text, as a
    target without a template that renders calls reads them. Each call is checked against its function's
    schema, so that generation reads every call it is sent."""
    try:
        tools = _tools(read.tools) or set_tools
    except _BadField as bad:
        raise _BadField(f"tools ({bad.field_name})" if bad.field_name != "tools" else "tools", bad.reason) from None
    names = {t["function"]["name"] for t in tools or []}
    for k, answer in enumerate(parsed.history):
        try:
            _, calls = agent_shapes.openhands_calls(answer, f"history[{k}]", tools)
        except agent_shapes.BadShape as bad:
            raise _BadField(f"answer {k + 1}", bad.reason) from None
        unknown = [c["name"] for c in calls if tools and c["name"] not in names]
        if unknown:
            raise _BadField(f"answer {k + 1}", f"calls {unknown[0]!r}, not one of the tools ({', '.join(names)})")
    return replace(parsed, tools=tools, calls="openhands")


def _spoken(row: dict, fmt: str) -> tuple[str | None, list[tuple[str, Any, str]]]:
    """A chat row's system text and its user and assistant turns as ``(role, text, where)``; a call or result
    is refused (it would be a role other than these)."""
    messages = row.get(fmt)
    if not isinstance(messages, list) or not messages:
        raise _BadField(fmt, "expected a non-empty list of messages")
    role_key, text_key = ("role", "content") if fmt == "messages" else ("from", "value")
    roles = OPENAI_ROLES if fmt == "messages" else SHAREGPT_ROLES
    system, spoken = None, []
    for i, msg in enumerate(messages):
        where = f"{fmt}[{i}]"
        role = roles.get(str(msg.get(role_key))) if isinstance(msg, dict) else None
        if role is None:
            raise _BadField(f"{where}.{role_key}", "expected an object with a known role")
        if role == "system" and not spoken:
            system = _text(msg, text_key, where=f"{where}.{text_key}")
        elif fmt == "messages" and role == "assistant" and _openai_calls(msg, where):
            spoken.append(("call", None, where))
        else:
            spoken.append((role, msg.get(text_key), f"{where}.{text_key}"))
    return system, spoken


def _with_set_tools(parsed: Prompt, set_tools: list[dict] | None) -> Prompt:
    """The set's tools for a row without its own; a row with the dataset's calls and still no tools is refused:
    generation would send none, and the model could never make the calls its results answer."""
    if parsed.tools is None and set_tools:
        if parsed.tool_steps is not None:
            return replace(parsed, tools=set_tools)
        return replace(parsed, tools=set_tools, tool_steps=[[] for _ in parsed.turns], open_end=True)
    if parsed.tools is None and parsed.tool_steps is not None:
        raise _BadField("tools", "the row has tool calls but no tools to send with them: give a tools column, "
                                 "or the set's tools in datasets.<name>.tools")
    return parsed


def _chat_turns(row: dict, fmt: str) -> Prompt:
    """User turns, system prompt, tools and the dataset's tool results of a chat row. Assistant
    turns (and their calls) are regenerated by the target, so the dataset's own answers are dropped."""
    messages = row.get(fmt)
    if not isinstance(messages, list) or not messages:
        raise _BadField(fmt, "expected a non-empty list of messages")
    role_key, text_key = ("role", "content") if fmt == "messages" else ("from", "value")
    roles = OPENAI_ROLES if fmt == "messages" else SHAREGPT_ROLES
    tools = _tools(row.get("tools"))
    turns: list[str] = []
    system = None
    steps = _Steps()
    for i, msg in enumerate(messages):
        where = f"{fmt}[{i}]"
        if not isinstance(msg, dict):
            raise _BadField(where, "expected an object")
        role = roles.get(str(msg.get(role_key)))
        if role is None:
            raise _BadField(f"{where}.{role_key}", f"unknown role {msg.get(role_key)!r}")
        if role == "system":
            system = _text(msg, text_key, where=f"{where}.{text_key}")
        elif role == "user":
            turns.append(_text(msg, text_key, where=f"{where}.{text_key}"))
            steps.user()
        elif fmt == "messages" and role == "assistant":
            calls = _openai_calls(msg, where)
            if not calls:
                _text(msg, text_key, where=f"{where}.{text_key}")
            steps.assistant(calls, where)
        elif fmt == "messages":
            steps.result(msg.get("tool_call_id"), _result_text(msg.get(text_key), f"{where}.{text_key}"), where)
        elif role == "assistant":
            _text(msg, text_key, where=f"{where}.{text_key}")
            steps.assistant([], where)
        elif role == "call":
            steps.assistant(_sharegpt_calls(msg.get(text_key), f"{where}.{text_key}"), where)
        else:
            for content in _sharegpt_results(msg.get(text_key), f"{where}.{text_key}", steps.unanswered()):
                steps.result(None, content, where)
    if not turns:
        raise _BadField(fmt, "no user message")
    if tools is None and not steps.saw_calls:
        return Prompt("", turns, system)
    return Prompt("", turns, system, tools, steps.done(), steps.open_end)


class _Steps:
    """The dataset's tool results grouped as :attr:`Prompt.tool_steps`: a stretch per user turn, a
    step per assistant turn that called tools, its results in the order of its calls."""

    def __init__(self) -> None:
        self.stretches: list[list[list[dict]]] = []
        self.calls: list[_Call] = []  # the open assistant turn's calls
        self.results: dict[int, dict] = {}  # call index -> result
        self.saw_calls = False
        self.open_end = True  # until an answer without calls: the data stops at a call, result or user turn

    def user(self) -> None:
        self._close()
        self.stretches.append([])
        self.open_end = True

    def assistant(self, calls: list[_Call], where: str) -> None:
        self._close()
        if calls and not self.stretches:
            raise _BadField(where, "a tool call before the first user message")
        self.calls = calls
        self.saw_calls = self.saw_calls or bool(calls)
        self.open_end = bool(calls)

    def unanswered(self) -> int:
        return len(self.calls) - len(self.results)

    def result(self, call_id: Any, content: str, where: str) -> None:
        """Pair a result with its call: by id where both carry one, else the first call unanswered."""
        if not self.calls:
            raise _BadField(where, "a tool result with no call before it")
        if call_id not in (None, "") and any(call.id is not None for call in self.calls):
            index = next((j for j, call in enumerate(self.calls) if call.id == call_id), None)
            if index is None:
                raise _BadField(f"{where}.tool_call_id", f"no call with id {call_id!r}")
            if index in self.results:
                raise _BadField(f"{where}.tool_call_id", f"call {call_id!r} already has a result")
        else:
            index = next((j for j in range(len(self.calls)) if j not in self.results), None)
            if index is None:
                raise _BadField(where, f"a tool result beyond the {len(self.calls)} call(s) before it")
        call = self.calls[index]
        self.results[index] = {"name": call.name, "arguments": call.arguments, "content": content}
        self.open_end = True

    def _close(self) -> None:
        if self.results:  # calls the dataset left unanswered (a trajectory's end) carry no result
            self.stretches[-1].append([self.results[j] for j in sorted(self.results)])
        self.calls, self.results = [], {}

    def done(self) -> list[list[list[dict]]]:
        self._close()
        return self.stretches


def _tools(value: Any) -> list[dict] | None:
    """The ``tools`` column as OpenAI function schemas; None when the row has none."""
    if value in (None, "", []):
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise _BadField("tools", "not valid JSON") from None
        if value in (None, []):
            return None
    if not isinstance(value, list):
        raise _BadField("tools", f"expected a list of function schemas, got {type(value).__name__}")
    tools = []
    for j, tool in enumerate(value):
        bare = isinstance(tool, dict) and "function" not in tool and "name" in tool
        schema = tool if bare else tool.get("function") if isinstance(tool, dict) else None
        where = f"tools[{j}]" if bare else f"tools[{j}].function"
        if not isinstance(schema, dict):
            raise _BadField(where, "expected a function schema (an object with a name)")
        _name(schema.get("name"), f"{where}.name")
        tools.append({"type": "function", "function": schema} if bare else tool)
    return tools


def _name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _BadField(where, "missing" if value is None else "expected a function name")
    return value


@dataclass(frozen=True)
class _Call:
    """A call of the dataset's: its id (None where the row gives none), function name and arguments."""

    id: str | None
    name: str
    arguments: dict


def _arguments(value: Any, where: str) -> dict:
    """Arguments are an object or a JSON string of one (OpenAI sends the string): :func:`call_arguments`."""
    parsed = call_arguments(value)
    if parsed is None:
        raise _BadField(where, "not valid JSON" if isinstance(value, str) else
                        f"expected an object, got {type(value).__name__}")
    return parsed


def _openai_calls(msg: dict, where: str) -> list[_Call]:
    """An assistant message's calls: ``tool_calls``, or the older ``function_call``."""
    if msg.get("function_call") is not None and not msg.get("tool_calls"):
        call = msg["function_call"]
        if not isinstance(call, dict):
            raise _BadField(f"{where}.function_call", "expected an object")
        arguments = _arguments(call.get("arguments", {}), f"{where}.function_call.arguments")
        return [_Call(None, _name(call.get("name"), f"{where}.function_call.name"), arguments)]
    value = msg.get("tool_calls")
    if value in (None, []):
        return []
    if not isinstance(value, list):
        raise _BadField(f"{where}.tool_calls", f"expected a list, got {type(value).__name__}")
    calls = []
    for j, call in enumerate(value):
        at = f"{where}.tool_calls[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            raise _BadField(f"{at}.function", "expected an object with a name and arguments")
        arguments = _arguments(function.get("arguments", {}), f"{at}.function.arguments")
        call_id = call.get("id")
        name = _name(function.get("name"), f"{at}.function.name")
        calls.append(_Call(str(call_id) if call_id not in (None, "") else None, name, arguments))
    return calls


def _sharegpt_calls(value: Any, where: str) -> list[_Call]:
    """A ``function_call`` turn's value: JSON ``{"name", "arguments"}``, or a list of them."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise _BadField(where, "function_call is not JSON") from None
    items = value if isinstance(value, list) else [value]
    if not items:
        raise _BadField(where, "function_call holds no call")
    calls = []
    for j, call in enumerate(items):
        at = where if len(items) == 1 else f"{where}[{j}]"
        if not isinstance(call, dict):
            raise _BadField(at, 'expected {"name": ..., "arguments": ...}')
        arguments = _arguments(call.get("arguments", {}), f"{at}.arguments")
        calls.append(_Call(None, _name(call.get("name"), f"{at}.name"), arguments))
    return calls


def _sharegpt_results(value: Any, where: str, unanswered: int) -> list[str]:
    """An observation's results: one, or the n results of n parallel calls as a JSON list."""
    text = _result_text(value, where)
    if unanswered > 1 and text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError:
            items = None
        if isinstance(items, list) and len(items) == unanswered:
            return [item if isinstance(item, str) else json.dumps(item, ensure_ascii=False) for item in items]
    return [text]


def _result_text(value: Any, where: str) -> str:
    """A tool result's text (empty allowed: a tool may answer nothing); an object is kept as JSON."""
    if value is None:
        raise _BadField(where, "missing")
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    if not isinstance(value, str):
        raise _BadField(where, f"expected a string, got {type(value).__name__}")
    return value


def _text(row: dict, key: str, where: str | None = None) -> str:
    value = row.get(key)
    where = where or key
    if value is None:
        raise _BadField(where, "missing")
    if not isinstance(value, str):
        raise _BadField(where, f"expected a string, got {type(value).__name__}")
    if not value.strip():
        raise _BadField(where, "empty prompt")
    return value


class _BadField(ValueError):
    def __init__(self, field_name: str, reason: str):
        super().__init__(reason)
        self.field_name = field_name
        self.reason = reason


def load_prompts(path: Path, fmt: str = "auto", prompt_field: str = "prompt", id_field: str = "id",
                 max_samples: int | None = None, max_prompt_chars: int = 100_000, skip: int = 0,
                 tools: list[dict] | None = None, history: str | None = None) -> PromptSet:
    """Read up to ``max_samples`` valid prompts from ``path`` after its first ``skip`` rows.

    Bad rows become rejects; duplicate ids are rejected too (resume-by-id needs unique ids). A shape that is
    recognised but not read where it stands (:class:`agent_shapes.ShapeNotBuilt`) refuses the whole set, naming it.
    ``tools``: the set's tools, for rows without their own. ``history``: as :func:`parse_row` reads it.
    """
    result = PromptSet()
    seen: set[str] = set()
    try:
        set_tools = _tools(tools)
    except _BadField as bad:
        raise ValueError(f"{path}: the set's tools: {bad.field_name}: {bad.reason}") from None
    for number, row in iter_rows(path):
        if number <= skip:
            continue
        if max_samples is not None and len(result.prompts) >= max_samples:
            break
        if isinstance(row, jsonl.JsonlError):
            result.rejects.append(Reject(str(path), number, "<line>", row.reason))
            continue
        try:
            parsed = parse_row(row, fmt, prompt_field, max_prompt_chars, set_tools, history)
        except _BadField as bad:
            result.rejects.append(Reject(str(path), number, bad.field_name, bad.reason))
            continue
        except agent_shapes.ShapeNotBuilt as err:
            raise ValueError(f"{path}: row {number}: {err}") from None
        raw_id = row.get(id_field)
        pid = str(raw_id) if raw_id not in (None, "") else parsed.digest  # stable
        if pid in seen:
            result.rejects.append(Reject(str(path), number, id_field, f"duplicate id {pid!r}"))
            continue
        seen.add(pid)
        result.prompts.append(replace(parsed, id=pid, environment=bfcl_environment(row)))
    return result


def load_configured(cfg: dict, base_dir: Path, apply_max_samples: bool = True) -> PromptSet:
    """Load a prompt source described by a validated config entry (dataset or evaluation set).

    A training dataset is read whole (``apply_max_samples=False``): generation stops at
    ``max_samples`` kept answers, so a dropped or failed prompt is replaced by the next one. An evaluation set (an
    entry without ``generation``) refuses trajectories: the grid does not run them.
    """
    history = (cfg["generation"] or {}).get("history") if "generation" in cfg else "refused"
    return load_prompts(resolve_source(cfg["source"], base_dir), fmt=cfg["format"], prompt_field=cfg["prompt_field"],
                        id_field=cfg["id_field"], max_samples=cfg["max_samples"] if apply_max_samples else None,
                        max_prompt_chars=cfg["max_prompt_chars"], skip=cfg["skip"], tools=cfg.get("tools"),
                        history=history)


def bfcl_environment(row: dict) -> dict | None:
    """A BFCL multi-turn row's environment; None for any other row (the wheel is imported only for such rows)."""
    if not isinstance(row.get("bfcl"), dict):
        return None
    from draftsmith.data import bfcl

    return bfcl.environment_of(row)


def write_prompts(prompts: list[Prompt], dest: Path) -> None:
    """The normalised prompt file the generate rule reads (a key only where the prompt has it, so a
    row without tools is written as before tools were read)."""
    from draftsmith.core.atomic import write_jsonl

    write_jsonl(dest, (_prompt_row(p) for p in prompts))


def _prompt_row(prompt: Prompt) -> dict:
    row: dict[str, Any] = {"id": prompt.id, "turns": prompt.turns}
    if prompt.system:
        row["system"] = prompt.system
    if prompt.tools is not None:
        row["tools"] = prompt.tools
    if prompt.tool_steps is not None:
        row["tool_steps"] = prompt.tool_steps
    if prompt.open_end:
        row["open_end"] = True
    if prompt.history is not None:
        row["history"] = prompt.history
    if prompt.environment is not None:
        row["environment"] = prompt.environment
    if prompt.calls:
        row["calls"] = prompt.calls
    return row


def read_prompts(path: Path) -> list[Prompt]:
    return [Prompt(row["id"], row["turns"], row.get("system"), row.get("tools"), row.get("tool_steps"),
                   row.get("open_end", False), row.get("history"), row.get("environment"),
                   row.get("calls")) for _, row in jsonl.read(path)]
