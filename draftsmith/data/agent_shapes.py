"""Agent and function-calling sets in the shapes they are published in, read into neutral turns.

Each reader turns one raw row into :class:`Shape`: the tools (before :mod:`draftsmith.data.datasets` checks
them as function schemas), the system prompt that is not tool instructions, and the conversation as
:class:`Turn` s that :func:`draftsmith.data.datasets.parse_row` pairs like any chat row's. Text parsing lives
here, pairing and validation of calls there, so each stays one owner's.

- ``glaive`` (glaiveai/glaive-function-calling-v2): a ``system`` text holding the function JSON, a ``chat``
  transcript of ``USER:`` / ``ASSISTANT:`` (``<functioncall> {...} <|endoftext|>``, its ``arguments`` a
  single-quoted string) / ``FUNCTION RESPONSE:`` turns.
- ``hermes`` (NousResearch/hermes-function-calling-v1): ShareGPT turns, the tools in the system prompt's
  ``<tools>`` (JSON or Python literals), calls as ``<tool_call>`` text in ``gpt`` turns, results as
  ``<tool_response>`` text in ``tool`` turns. A system prompt holding ``<tools>`` is the dataset's own tool
  instructions and is left out: the target's template (or ``tool_rendering: text``) writes its own.
- ``xlam`` (Salesforce xLAM / APIGen): ``query``, ``tools`` (parameters as ``{name: {type: "str", ...}}``,
  not JSON schema), ``answers`` (the calls), the latter two often JSON strings.
- ``sweagent`` (nebius/SWE-agent-trajectories): a ``trajectory`` of ``system`` / ``user`` / ``ai`` turns with
  ``text``, the observations user turns, the actions commands in the ``ai`` text (kept as text). Regenerated on
  its own history (:attr:`draftsmith.data.datasets.Prompt.history`): each action on the context it had.
- ``openhands`` (SWE-Gym/OpenHands-SFT-Trajectories and other OpenHands exports made for models without function
  calling): OpenAI ``messages`` whose calls are text in the assistant content, ``<function=NAME>`` /
  ``<parameter=KEY>VALUE</parameter>`` / ``</function>``, each result a user turn ``EXECUTION RESULT of [NAME]:``
  (a ``tool`` message, where an export has one, is read as that turn), the functions described in the system
  prompt. A trajectory too: read as its text here; :func:`openhands_messages` reads its calls and results as
  structure where the target's template renders them. An export made with function calling
  (nebius/SWE-rebench-openhands-trajectories: a ``trajectory`` of OpenAI messages, each carrying every field, null
  where unused) has its calls as ``tool_calls`` (``arguments`` a JSON string) answered by ``tool`` messages (parallel
  calls by consecutive ones) and its tools in ``tools``: read as the same text, the calls written in OpenHands'
  markup and the results as one ``EXECUTION RESULT`` turn, so that both exports are one reading.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any

SHAPES = ("glaive", "hermes", "xlam", "sweagent", "openhands")
HERMES_MARKUP = ("<tools>", "<tool_call>")


@dataclass(frozen=True)
class Turn:
    """One turn of a conversation: ``user`` / ``assistant`` text, a ``call`` turn (``calls``: the
    dataset's ``{"name", "arguments"}``), or a ``result``; ``where`` names the raw field it came from."""

    role: str
    where: str
    text: str | None = None
    calls: list[Any] | None = None


@dataclass(frozen=True)
class Shape:
    turns: list[Turn]
    system: str | None
    tools: Any  # the row's tools, still to be checked as function schemas (None: the row has none)
    tools_where: str = "tools"  # the raw field they came from


class BadShape(ValueError):
    """A raw field that cannot be read in its shape: ``field_name`` names it, as a reject does."""

    def __init__(self, field_name: str, reason: str):
        super().__init__(reason)
        self.field_name = field_name
        self.reason = reason


class ShapeNotBuilt(ValueError):
    """A shape that is recognised but not read where it stands (a trajectory as an evaluation set): the whole set is
    refused naming it."""


def detect(row: dict) -> str | None:
    """The shape whose keys leave no doubt, else None (the row is read as before)."""
    if "system" in row and "chat" in row:
        return "glaive"
    if {"query", "answers", "tools"} <= row.keys():
        return "xlam"
    if "trajectory" in row:
        return "openhands" if openai_trajectory(row["trajectory"]) else "sweagent"
    return None


def openai_trajectory(trajectory: Any) -> bool:
    """Whether a trajectory is OpenAI messages, every item a ``role`` and a ``content`` and none SWE-agent's
    ``text``: an OpenHands export with function calling (nebius/SWE-rebench-openhands-trajectories). A row that
    SWE-agent's reading loads has a ``text`` in every item, so it is never taken for one."""
    return isinstance(trajectory, list) and bool(trajectory) and all(
        isinstance(t, dict) and "role" in t and "content" in t and "text" not in t for t in trajectory)


def hermes_markup(messages: Any) -> bool:
    """Whether ShareGPT turns hold Hermes tool markup as text (tools and calls a chat reading would lose)."""
    return isinstance(messages, list) and any(
        isinstance(m, dict) and isinstance(m.get("value"), str) and any(tag in m["value"] for tag in HERMES_MARKUP)
        for m in messages)


def openhands_markup(messages: Any) -> bool:
    """Whether OpenAI messages hold OpenHands calls as text (``<function=NAME>`` in an assistant turn)."""
    return isinstance(messages, list) and any(
        isinstance(m, dict) and m.get("role") == "assistant" and _OH_CALL.search(_plain(m.get("content")))
        for m in messages)


def _plain(content: Any) -> str:
    """A message's text for a search (its parts joined; nothing where it is neither)."""
    try:
        return _openhands_text(content, "")
    except BadShape:
        return ""


def read(row: dict, shape: str) -> Shape:
    if shape == "glaive":
        return glaive(row)
    if shape == "hermes":
        return hermes(row)
    if shape == "xlam":
        return xlam(row)
    if shape == "sweagent":
        return sweagent(row)
    if shape == "openhands":
        return openhands(row)
    raise ValueError(f"unknown shape {shape!r}")


# ---------------------------------------------------------------- SWE-agent

SWEAGENT_ROLES = {"system": "system", "user": "user", "ai": "assistant"}


def sweagent(row: dict) -> Shape:
    """A trajectory's turns as they stand: the system text, observations as user turns, actions as assistant text."""
    trajectory = row.get("trajectory")
    if not isinstance(trajectory, list) or not trajectory:
        raise BadShape("trajectory", "expected a non-empty list of {role, text} turns")
    system, turns = None, []
    for k, turn in enumerate(trajectory):
        where = f"trajectory[{k}]"
        role = SWEAGENT_ROLES.get(turn.get("role")) if isinstance(turn, dict) else None
        if role is None:
            raise BadShape(f"{where}.role", f"expected one of {', '.join(SWEAGENT_ROLES)}")
        text = turn.get("text")
        if not isinstance(text, str):
            raise BadShape(f"{where}.text", "missing" if text is None else f"expected a string, got "
                                                                          f"{type(text).__name__}")
        if role == "system" and (k or system is not None):
            raise BadShape(where, "a system turn after the first turn")
        if role == "system":
            system = text
        else:
            turns.append(Turn(role, where, text))
    return Shape(turns, system, None)


# ---------------------------------------------------------------- OpenHands

# OpenHands' fn_call_converter: the calls' markup, a result's header, what it adds to the system prompt and to the
# first user turn (an in-context example) for a model without function calling
_OH_CALL = re.compile(r"<function=([^>\n]+)>\n?(.*?)(?:</function>|\Z)", re.S)
_OH_PARAM = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)
_OH_RESULT = re.compile(r"EXECUTION RESULT of \[([^\]\n]+)\]:\n?")
_OH_FUNCTIONS = "\nYou have access to the following functions:"
_OH_EXAMPLE_END = "--------------------- NEW TASK DESCRIPTION ---------------------\n"
_OH_EXAMPLE_START = "Here's a running example of how to perform a task with the provided tools."
_OH_TASK_END = "\n--------------------- END OF NEW TASK DESCRIPTION ---------------------"
OPENHANDS_ROLES = {"system": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


def openhands(row: dict) -> Shape:
    """The export as text turns: results (``tool`` messages too, consecutive ones as one turn) as
    ``EXECUTION RESULT of [NAME]:`` user turns, calls as the assistant wrote them (structured ``tool_calls`` in
    OpenHands' markup); each call's markup checked here, so a row that cannot be read as calls is refused at load,
    not at generation. The messages: ``messages``, else a ``trajectory``. Tools: the export's ``tools`` field where
    it has one."""
    key = openhands_key(row)
    messages = row.get(key)
    if not isinstance(messages, list) or not messages:
        raise BadShape(key, "expected a non-empty list of {role, content} messages")
    system, turns = None, []
    for i, msg in enumerate(messages):
        where = f"{key}[{i}]"
        role = OPENHANDS_ROLES.get(msg.get("role")) if isinstance(msg, dict) else None
        if role is None:
            raise BadShape(f"{where}.role", f"expected one of {', '.join(OPENHANDS_ROLES)}")
        structured = msg.get("tool_calls") if role == "assistant" else None
        content = msg.get("content")
        text = _openhands_text("" if content is None and structured else content, f"{where}.content")
        if role == "system" and (i or system is not None):
            raise BadShape(where, "a system turn after the first turn")
        if role == "system":
            system = text
        elif role == "tool":
            result = f"EXECUTION RESULT of [{msg.get('name') or 'tool'}]:\n{text}"
            if i and messages[i - 1].get("role") == "tool":  # a parallel call's: one turn answers the assistant turn
                result = f"{turns.pop().text}{RESULTS_APART}{result}"
            turns.append(Turn("user", where, result))
        else:
            if role == "assistant":
                text = _with_structured_calls(text, structured, where) if structured else text
                openhands_calls(text, where)
            turns.append(Turn(role, where, text))
    return Shape(turns, system, row.get("tools"))


def openhands_key(row: dict) -> str:
    """Where an export's messages are: ``messages``, else (nebius's export) ``trajectory``."""
    return "trajectory" if "messages" not in row and "trajectory" in row else "messages"


RESULTS_APART = "\n\n"  # between the results of parallel calls in one EXECUTION RESULT turn


def _with_structured_calls(text: str, tool_calls: Any, where: str) -> str:
    """An assistant turn's text and its ``tool_calls`` written as OpenHands writes calls for a model without
    function calling, so that the export is read as the text one is: text where the template does not render
    calls, calls again (:func:`openhands_calls`) where it does. A value that is not a string is written as JSON,
    one holding a newline wrapped in newlines (which the reading drops). The calls are read back here: a turn
    whose text already holds markup, or a value that would not read back as written, is refused."""
    if not isinstance(tool_calls, list):
        raise BadShape(f"{where}.tool_calls", f"expected a list, got {type(tool_calls).__name__}")
    if "<function=" in text:
        raise BadShape(where, "its content holds <function= markup besides its tool_calls")
    written, blocks = [], []
    for c, call in enumerate(tool_calls):
        at = f"{where}.tool_calls[{c}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise BadShape(at, "expected {function: {name, arguments}}")
        arguments = _call_arguments(function.get("arguments"), f"{at}.function.arguments")
        values = {k: v if isinstance(v, str) else json.dumps(v) for k, v in arguments.items()}
        params = "".join(f"<parameter={k}>{_wrapped(v)}</parameter>\n" for k, v in values.items())
        blocks.append(f"<function={function['name']}>\n{params}</function>")
        written.append({"name": function["name"], "arguments": values})
    text = "\n".join([text.strip(), *blocks]) if text.strip() else "\n".join(blocks)
    if openhands_calls(text, where)[1] != written:
        raise BadShape(f"{where}.tool_calls", "a call whose values hold OpenHands markup (</parameter>, </function>)")
    return text


def _call_arguments(arguments: Any, where: str) -> dict:
    """A structured call's arguments: an object, or a JSON string of one (as the export stores them)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            raise BadShape(where, "not valid JSON") from None
    if not isinstance(arguments, dict):
        raise BadShape(where, f"expected an object, got {type(arguments).__name__}")
    return arguments


def _wrapped(value: str) -> str:
    return f"\n{value}\n" if "\n" in value else value


def _openhands_text(content: Any, where: str) -> str:
    """A message's content: a string, or OpenAI's list of ``{"type": "text", "text": ...}`` parts (joined by
    newlines, as OpenHands serialises them)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in content):
        return "\n".join(p["text"] for p in content)
    raise BadShape(where, "missing" if content is None else "expected a string or a list of text parts")


def openhands_calls(text: str, where: str, tools: list[dict] | None = None) -> tuple[str, list[dict]]:
    """An assistant turn's text before its calls, and the calls (``{"name", "arguments"}``): each parameter's
    value as written (one newline either side dropped: OpenHands wraps multi-line values in them), read as
    JSON where the function's schema (``tools``) types it otherwise than as a string. A call cut before its
    ``</function>`` (the stop word OpenHands sends) is read to the end of the text."""
    calls, schemas = [], {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools or []}
    for name, body in _OH_CALL.findall(text):
        types = {k: v.get("type") for k, v in (schemas.get(name, {}).get("properties") or {}).items()}
        arguments = {}
        for key, value in _OH_PARAM.findall(body):
            value = value.removeprefix("\n").removesuffix("\n")
            arguments[key] = value if types.get(key, "string") == "string" else _typed(value, where)
        calls.append({"name": name.strip(), "arguments": arguments})
    if "<function=" in text and not calls:
        raise BadShape(where, "holds <function= markup that is not <function=NAME>...</function>")
    return text.split("<function=", 1)[0].strip(), calls


def _typed(value: str, where: str) -> Any:
    """A parameter value its schema types as a number, boolean, array or object (``true``, ``[1, 20]``)."""
    typed = _literal(value.strip())
    if typed is None and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if typed is None:
        raise BadShape(where, f"parameter value {value[:40]!r} is not of its schema's type")
    return typed


def openhands_messages(messages: list[dict], tools: list[dict]) -> list[dict]:
    """A trajectory's context with its calls and results as structure, for a template that renders calls: the
    system prompt without the functions' description OpenHands appended (the template writes the tools), the
    first user turn without the in-context example, each assistant turn's calls as ``tool_calls`` answered by
    the next turn's ``EXECUTION RESULT`` as a ``tool`` message. A call whose next turn is not its result stays
    text, as does an assistant turn without calls."""
    out: list[dict] = []
    first_user, answering = True, []
    for j, msg in enumerate(messages):
        role, text = msg["role"], msg["content"]
        if role == "system":
            out.append({"role": "system", "content": text.split(_OH_FUNCTIONS, 1)[0].rstrip()})
        elif role == "user" and first_user:
            first_user = False
            if _OH_EXAMPLE_START in text and _OH_EXAMPLE_END in text:
                text = text.split(_OH_EXAMPLE_END, 1)[1].split(_OH_TASK_END, 1)[0]
            out.append({"role": "user", "content": text})
        elif role == "assistant":
            nxt = messages[j + 1]["content"] if j + 1 < len(messages) else ""
            said, calls = openhands_calls(text, f"messages[{j}]", tools)
            results = _results(nxt, len(calls))
            if calls and [name for name, _ in results] == [c["name"] for c in calls]:
                ids = [f"call_{j}_{c}" if c else f"call_{j}" for c in range(len(calls))]
                out.append({"role": "assistant", "content": said, "tool_calls": [
                    {"id": i, "type": "function", "function": {"name": c["name"], "arguments": json.dumps(
                        c["arguments"])}} for i, c in zip(ids, calls, strict=True)]})
                answering = [(i, name, content) for i, (name, content) in zip(ids, results, strict=True)]
            else:
                out.append(dict(msg))
        elif role == "user" and answering:
            out.extend({"role": "tool", "tool_call_id": i, "name": name, "content": content}
                       for i, name, content in answering)
            answering = []
        else:
            out.append(dict(msg))
    return out


def _results(text: str, calls: int) -> list[tuple[str, str]]:
    """An ``EXECUTION RESULT`` turn as ``(name, content)`` per call it answers: the whole turn for one call, the
    results :data:`RESULTS_APART` for parallel ones; none where the turn is not that many results."""
    pieces = [text] if calls == 1 else re.split(rf"{RESULTS_APART}(?=EXECUTION RESULT of \[)", text)
    found = [_OH_RESULT.match(p) for p in pieces]
    if not calls or len(pieces) != calls or not all(found):
        return []
    return [(m[1], p[m.end():]) for m, p in zip(found, pieces, strict=True)]


# ---------------------------------------------------------------- Glaive

GLAIVE_ROLES = {"USER": "user", "ASSISTANT": "assistant", "FUNCTION RESPONSE": "result"}
_GLAIVE_TURN = re.compile(r"^(USER|ASSISTANT|FUNCTION RESPONSE):[ \t]?", re.M)
_END_OF_TEXT = "<|endoftext|>"


def glaive(row: dict) -> Shape:
    system_text = _string(row, "system").removeprefix("SYSTEM:").strip()
    start = system_text.find("{")
    tools = _json_objects(system_text[start:], "system") if start >= 0 else None
    system = None if tools else (system_text or None)  # with functions, the text is their instructions
    pieces = _GLAIVE_TURN.split(_string(row, "chat"))
    if pieces[0].strip():
        raise BadShape("chat", "text before the first USER: / ASSISTANT: / FUNCTION RESPONSE: turn")
    turns = []
    for k, (marker, body) in enumerate(zip(pieces[1::2], pieces[2::2], strict=True)):
        where, text = f"chat[{k}]", body.strip().removesuffix(_END_OF_TEXT).strip()
        role = GLAIVE_ROLES[marker]
        if role == "assistant" and "<functioncall>" in text:
            call = text.split("<functioncall>", 1)[1].strip()
            turns.append(Turn("call", where, calls=[_glaive_call(call, where)]))
        else:
            turns.append(Turn(role, where, text))
    return Shape(turns, system, tools, "system")


def _glaive_call(text: str, where: str) -> dict:
    """``{"name": ..., "arguments": '{...}'}``: JSON but for the single-quoted arguments (a Python
    literal then), or with an apostrophe inside them (taken up to the last quote)."""
    call = _literal(text)
    if call is None:
        found = re.fullmatch(r"\{\s*\"name\"\s*:\s*\"([^\"]+)\"\s*,\s*\"arguments\"\s*:\s*'(.*)'\s*\}", text, re.S)
        if found is None:
            raise BadShape(where, "<functioncall> is not {\"name\": ..., \"arguments\": ...}")
        call = {"name": found[1], "arguments": found[2]}
    if not isinstance(call, dict):
        raise BadShape(where, "<functioncall> is not {\"name\": ..., \"arguments\": ...}")
    return call


def _json_objects(text: str, where: str) -> list[dict]:
    """Objects written one after another (Glaive's functions, separated by blank lines)."""
    decoder, objects, i = json.JSONDecoder(), [], 0
    while i < len(text):
        if text[i].isspace():
            i += 1
            continue
        try:
            value, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError as err:
            raise BadShape(where, f"function JSON not readable at character {err.pos}: {err.msg}") from None
        objects.append(value)
    return objects


# ---------------------------------------------------------------- Hermes

HERMES_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                "tool": "result", "function": "result", "observation": "result"}


def hermes(row: dict) -> Shape:
    messages = row.get("conversations")
    if not isinstance(messages, list) or not messages:
        raise BadShape("conversations", "expected a non-empty list of messages")
    system, tools, tools_where, turns = None, None, "conversations", []
    for i, msg in enumerate(messages):
        where = f"conversations[{i}]"
        if not isinstance(msg, dict):
            raise BadShape(where, "expected an object")
        role = HERMES_ROLES.get(str(msg.get("from")))
        if role is None:
            raise BadShape(f"{where}.from", f"unknown role {msg.get('from')!r}")
        text = msg.get("value")
        where = f"{where}.value"
        if not isinstance(text, str):
            raise BadShape(where, "missing" if text is None else f"expected a string, got {type(text).__name__}")
        if role == "system":
            blocks = _tagged(text, "tools")
            if blocks:  # the dataset's tool instructions: the tools are sent as structure instead
                tools = [tool for block in blocks for tool in _hermes_tools(block, where)]
                tools_where = where
            else:
                system = text
        elif role == "assistant" and (blocks := _tagged(text, "tool_call")):
            turns.append(Turn("call", where, calls=[_python_or_json(b, where, "<tool_call>") for b in blocks]))
        elif role == "result":
            turns.extend(Turn("result", where, b.strip()) for b in (_tagged(text, "tool_response") or [text]))
        else:
            turns.append(Turn(role, where, text))
    return Shape(turns, system, tools, tools_where)


def _tagged(text: str, tag: str) -> list[str]:
    return re.findall(rf"<{tag}>(.*?)</{tag}>", text, re.S)


def _hermes_tools(block: str, where: str) -> list:
    """A ``<tools>`` block: a list of schemas or one schema, as JSON or as Python literals, or schemas one
    after another."""
    value = _literal(block.strip())
    if value is None:
        value = _json_objects(block.strip(), where)
    return value if isinstance(value, list) else [value]


def _python_or_json(text: str, where: str, what: str) -> Any:
    value = _literal(text.strip())
    if value is None:
        raise BadShape(where, f"{what} is neither JSON nor a Python literal")
    return value


# ---------------------------------------------------------------- xLAM / APIGen

# Python type names xLAM writes, as JSON schema types
XLAM_TYPES = {"str": "string", "string": "string", "int": "integer", "integer": "integer", "float": "number",
              "number": "number", "bool": "boolean", "boolean": "boolean", "list": "array", "array": "array",
              "tuple": "array", "set": "array", "dict": "object", "object": "object", "null": "null",
              "none": "null"}


def xlam(row: dict) -> Shape:
    query = _string(row, "query")
    tools = [_xlam_tool(tool, f"tools[{j}]") for j, tool in enumerate(_decoded(row.get("tools"), "tools"))]
    answers = _decoded(row.get("answers"), "answers")
    turns = [Turn("user", "query", query)]
    if answers:  # the dataset's calls; none (an irrelevance row) leaves a plain request with tools
        turns.append(Turn("call", "answers", calls=answers))
    return Shape(turns, None, tools)


def _decoded(value: Any, where: str) -> list:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise BadShape(where, "not valid JSON") from None
    if not isinstance(value, list):
        raise BadShape(where, "missing" if value is None else f"expected a list, got {type(value).__name__}")
    return value


def _xlam_tool(tool: Any, where: str) -> dict:
    """``{name, description, parameters: {param: {type, description, default}}}`` as a function schema whose
    parameters are JSON schema; parameters that already are JSON schema are kept."""
    if not isinstance(tool, dict):
        raise BadShape(where, "expected a function (an object with a name)")
    params = tool.get("parameters") or {}
    if not isinstance(params, dict):
        raise BadShape(f"{where}.parameters", f"expected an object, got {type(params).__name__}")
    if params.get("type") == "object" and isinstance(params.get("properties"), dict):
        return {**tool, "parameters": params}
    properties, required = {}, []
    for name, spec in params.items():
        at = f"{where}.parameters.{name}"
        if not isinstance(spec, dict):
            raise BadShape(at, f"expected an object with a type, got {type(spec).__name__}")
        schema, optional = python_type_schema(spec.get("type"), f"{at}.type")
        schema |= {k: v for k, v in spec.items() if k not in ("type", "required", "optional")}
        marked = spec.get("required")
        if marked is True or (marked is None and not optional and not spec.get("optional") and "default" not in spec):
            required.append(name)
        properties[name] = schema
    return {**tool, "parameters": {"type": "object", "properties": properties, "required": required}}


def python_type_schema(value: Any, where: str) -> tuple[dict, bool]:
    """A Python type as xLAM writes it (``str``, ``List[int]``, ``Optional[str]``, ``int, optional``) as JSON
    schema, and whether it is marked optional. A type JSON schema has no word for (``Callable``, ``Any``)
    leaves the type open rather than the row refused."""
    if value is None:
        return {}, False
    if not isinstance(value, str):
        raise BadShape(where, f"expected a type name, got {type(value).__name__}")
    text, optional = value.strip(), False
    if re.search(r",\s*optional\s*$", text, re.I):
        text, optional = re.sub(r",\s*optional\s*$", "", text, flags=re.I).strip(), True
    found = re.fullmatch(r"(\w+)\s*\[(.*)\]", text, re.S)
    outer, inner = (found[1].lower(), found[2].strip()) if found else (text.lower(), "")
    if outer == "optional":
        return python_type_schema(inner, where)[0], True
    if outer in ("list", "set", "tuple", "sequence", "iterable") and inner and "," not in inner:
        return {"type": "array", "items": python_type_schema(inner, where)[0]}, optional
    json_type = XLAM_TYPES.get(outer)
    return ({"type": json_type} if json_type else {}), optional


# ---------------------------------------------------------------- shared


def _string(row: dict, key: str) -> str:
    value = row.get(key)
    if not isinstance(value, str):
        raise BadShape(key, "missing" if value is None else f"expected a string, got {type(value).__name__}")
    return value


def _literal(text: str) -> Any:
    """JSON, else a Python literal (single quotes, True / None), else None."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
