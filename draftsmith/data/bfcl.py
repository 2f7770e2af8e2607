"""Tool-call prompt sets from the ``bfcl-eval`` wheel (Berkeley Function Calling Leaderboard v4), as
OpenAI ``messages`` + ``tools`` rows: the source form ``bfcl:<category>``.

The wheel is installed without its dependencies (it pins numpy 1.26.4 and tree-sitter): only its data
files and its pure-Python API classes are used. Its function docs are not JSON schema (``dict``,
``float``, ``tuple``, ``any``) and their names hold dots, which OpenAI tool names forbid; both are
mapped here. Multi-turn rows carry no tool results: their ground-truth calls are executed with the
wheel's own API classes (the file system, trading bot...) so that the conversation holds real results,
as an agent loop would see them. They also carry their environment (``bfcl.environment``: the classes, their
initial config, the tool-name map, long_context and the ground-truth calls), with which generation sets up the
row's own instances (:class:`Instances`) and runs the target's own calls on them, as BFCL's harness does.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import copy
import importlib
import inspect
import json
import keyword
import re
import threading
import uuid
from collections.abc import Iterator
from importlib.resources.abc import Traversable
from typing import Any

from draftsmith.data.tool_calls import call_arguments

SINGLE_TURN = ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance", "live_simple",
               "live_multiple", "live_parallel", "live_parallel_multiple", "live_irrelevance", "live_relevance")
MULTI_TURN = ("multi_turn_base", "multi_turn_long_context")  # long_context: the classes load bigger states
CATEGORIES = SINGLE_TURN + MULTI_TURN
INSTALL = "envs/setup.sh installs it: uv pip install --no-deps bfcl-eval==2026.3.23"

# BFCL's type names that JSON schema spells otherwise; "any" means no type constraint at all.
TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": None}
JSON_TYPES = {"object", "number", "array", "string", "integer", "boolean", "null"}
SCHEMA_KEYS = {"type", "description", "properties", "items", "required", "enum", "default", "format", "maximum",
               "minimum", "additionalProperties"}  # "optional" and "response" are BFCL's own: dropped
_NAME_BAD = re.compile(r"[^a-zA-Z0-9_-]")


class BfclError(ValueError):
    """A BFCL source that cannot be read; the message names the source, and the row where one is at fault."""


def tool_name(name: str) -> str:
    """An OpenAI-legal tool name (``^[a-zA-Z0-9_-]{1,64}$``): ``math.factorial`` -> ``math_factorial``."""
    return _NAME_BAD.sub("_", name)[:64]


def to_json_schema(doc: dict) -> dict:
    """A BFCL function doc as an OpenAI tool: name sanitized, parameter types mapped recursively."""
    parameters = _schema(doc.get("parameters") or {"type": "dict", "properties": {}}, "parameters")
    return {"type": "function", "function": {"name": tool_name(doc["name"]),
                                             "description": doc.get("description", ""), "parameters": parameters}}


def _schema(node: dict, where: str) -> dict:
    """One schema node: its type mapped, its properties, items and additionalProperties recursively."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key not in SCHEMA_KEYS:
            continue
        if key == "type":
            mapped = TYPES.get(value, value)
            if mapped is not None and mapped not in JSON_TYPES:
                raise BfclError(f"{where}.type: unknown type {value!r}")
            if mapped is not None:
                out["type"] = mapped
        elif key == "properties":
            out["properties"] = {name: _schema(sub, f"{where}.properties.{name}") for name, sub in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _schema(value, f"{where}.{key}")
        else:
            out[key] = value
    return out


def tools_for(row_id: str, docs: list[dict]) -> tuple[list[dict], dict[str, str]]:
    """The row's tools and the map from each tool name to BFCL's (so calls map back); two docs whose
    names sanitize to one tool name would make calls ambiguous: an error naming the row."""
    tools, names = [], {}
    for doc in docs:
        try:
            tool = to_json_schema(doc)
        except BfclError as err:
            raise BfclError(f"{row_id}: function {doc.get('name')!r}: {err}") from None
        name = tool["function"]["name"]
        if name in names:
            raise BfclError(f"{row_id}: function names {names[name]!r} and {doc['name']!r} both become tool "
                            f"name {name!r}")
        names[name] = doc["name"]
        tools.append(tool)
    return tools, names


def rows(category: str) -> Iterator[dict]:
    """The category's rows: ``{"id", "messages", "tools", "bfcl": {"category", "tool_names", "executed",
    "note"}}``. ``executed`` is None for a single-turn row, True where a multi-turn row holds its
    executed ground-truth calls and their results, False where it fell back to its user turns (``note``
    says why)."""
    data = data_dir(category)
    if category in SINGLE_TURN:
        for row in _jsonl(data / f"BFCL_v4_{category}.json"):
            tools, names = tools_for(row["id"], row["function"])
            messages = [msg for turn in row["question"] for msg in turn]
            yield _row(row["id"], category, messages, tools, names, None, None)
        return
    answers = {a["id"]: a["ground_truth"] for a in _jsonl(data / "possible_answer" / f"BFCL_v4_{category}.json")}
    docs: dict[str, list[dict]] = {}  # class -> its function docs, read once
    for row in _jsonl(data / f"BFCL_v4_{category}.json"):
        for cls in row["involved_classes"]:
            if cls not in docs:
                docs[cls] = _class_docs(data, cls)
        tools, names = tools_for(row["id"], [d for cls in row["involved_classes"] for d in docs[cls]])
        long_context = category == "multi_turn_long_context"
        try:
            messages, note = executed_messages(row, answers.get(row["id"]), long_context), None
        except Exception as err:  # any failure of the wheel's classes (an import, a call): keep the user turns
            messages = [msg for turn in row["question"] for msg in turn]
            note = f"ground truth not executed ({type(err).__name__}: {err}); user turns only"
        out = _row(row["id"], category, messages, tools, names, note is None, note)
        out["bfcl"]["environment"] = {"classes": row["involved_classes"],
                                      "initial_config": row.get("initial_config", {}),
                                      "tool_names": out["bfcl"]["tool_names"], "long_context": long_context,
                                      "ground_truth": answers.get(row["id"])}
        yield out


def _row(row_id: str, category: str, messages: list[dict], tools: list[dict], names: dict[str, str],
         executed: bool | None, note: str | None) -> dict:
    return {"id": row_id, "messages": messages, "tools": tools,
            "bfcl": {"category": category, "tool_names": {k: v for k, v in names.items() if k != v},
                     "executed": executed, "note": note}}


def environment_of(row: Any) -> dict | None:
    """A multi-turn row's environment (what :class:`Instances` sets up); None for any other row."""
    return row.get("bfcl", {}).get("environment") if isinstance(row, dict) and isinstance(row.get("bfcl"), dict) \
        else None


def expected_calls(environment: dict) -> int:
    """The ground-truth calls of a row: what the target's own calls are counted against."""
    return sum(len(turn) for turn in environment.get("ground_truth") or [])


def step_limit() -> int:
    """BFCL's own limit on a user turn's steps (its harness quits the entry past it)."""
    from bfcl_eval.constants.default_prompts import MAXIMUM_STEP_LIMIT

    return MAXIMUM_STEP_LIMIT


class SetupFailed(RuntimeError):
    """The row's instances could not be set up (an import of the wheel's classes, a scenario it cannot load)."""


EXECUTION_ERROR = "Error during execution: "  # the prefix of BFCL's harness for a call that raised
# A call of the target's that runs longer (``power(base=10, exponent=10**12)``) is answered with a timeout error and
# its row's instances are abandoned (:meth:`Instances.run_bounded`): the calls BFCL's classes make take milliseconds.
CALL_TIMEOUT_S = 5.0


class Instances:
    """A row's own fresh instances of BFCL's classes, set up once with its initial config, their state carried
    across the row's turns. Each call runs through BFCL's own harness (``multi_turn_utils.
    execute_multi_turn_func_call``, the call written as its handlers write it), so its result and its error
    text are BFCL's. Only a public method of the row's classes reaches the harness, which ``eval``-s the call: any
    other name gets the text BFCL gives a name it does not know, never a builtin's run, and an argument name that is
    not an identifier is refused before it reaches the text. The harness keeps the
    instances in its module's globals under a name of their own; :meth:`close` removes them."""

    def __init__(self, environment: dict):
        from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

        self._utils = multi_turn_utils
        self.abandoned = False  # a call timed out in its thread, which may still change the instances' state
        self._model = f"draftsmith_{uuid.uuid4().hex}"
        self._environment = environment
        try:
            _, instances = self._harness([])
        except Exception as err:  # any failure of the wheel's classes: the row is named, never silent
            self.close()
            raise SetupFailed(f"{', '.join(environment['classes'])}: {type(err).__name__}: {err}") from None
        self._methods = {name: method for instance in instances.values()
                         for name, method in inspect.getmembers(instance, inspect.ismethod)
                         if not name.startswith("_")}  # a later class's method shadows an earlier one's, as there

    def _harness(self, calls: list[str]) -> tuple[list[str], dict]:
        env = self._environment
        return self._utils.execute_multi_turn_func_call(calls, env["initial_config"], env["classes"], self._model,
                                                        "row", long_context=env.get("long_context", False))

    def run(self, call: dict) -> tuple[str, str | None]:
        """One of the target's calls (OpenAI shape) run: its result text, and why it is an error (None: none).
        ``unknown_function``: no method of the row's classes has the name; ``bad_arguments``: arguments that are
        not a JSON object, names that are not identifiers (never written into the text the harness ``eval``-s), or
        that the method does not take; ``raised``: the method raised; ``error_result``: the
        class answered with its own error (``{"error": ...}``: ``cd`` into a folder that is not there)."""
        function = call["function"]
        name = self._environment.get("tool_names", {}).get(function["name"], function["name"])
        arguments = call_arguments(function.get("arguments"))
        if arguments is None:  # BFCL's handler fails to decode such a call; there is no text of its own for it
            return f"{EXECUTION_ERROR}the arguments are not a JSON object", "bad_arguments"
        method = self._methods.get(name)
        if method is None:
            return f"{EXECUTION_ERROR}name {name!r} is not defined", "unknown_function"
        # the names are written into the text the harness eval-s: one that is not an identifier would be code run
        if odd := [key for key in arguments if not key.isidentifier() or keyword.iskeyword(key)]:
            return f"{EXECUTION_ERROR}argument names that are not identifiers: {odd}", "bad_arguments"
        text = f"{name}({','.join(f'{k}={v!r}' for k, v in arguments.items())})"  # BFCL's convert_to_function_call
        [result], _ = self._harness([text])
        if result.startswith(EXECUTION_ERROR):
            return result, "raised" if _binds(method, arguments) else "bad_arguments"
        return result, "error_result" if _error_result(result) else None

    async def run_bounded(self, call: dict) -> tuple[str, str | None]:
        """:meth:`run` in a thread of its own, awaited up to :data:`CALL_TIMEOUT_S`, so that a slow call stalls no
        other conversation on the event loop. Past it: BFCL's error text saying so, ``timeout``, and the instances
        :attr:`abandoned`. A thread cannot be killed: the call goes on in its daemon thread, which nothing waits for
        (not the loop, not the interpreter's exit), and the row's state is whatever it leaves, so no later call of
        the row runs on it (the conversation ends, :func:`~draftsmith.generation.generate.converse`). A call stuck
        in one C operation that holds the GIL (a huge integer power) still stalls every thread until it returns:
        only a process of its own could bound that."""
        loop = asyncio.get_running_loop()
        answered: asyncio.Future = loop.create_future()

        def settle(outcome: tuple[str, str | None] | BaseException) -> None:
            if answered.done():  # timed out: nobody waits for it
                return
            if isinstance(outcome, BaseException):
                answered.set_exception(outcome)
            else:
                answered.set_result(outcome)

        def work() -> None:
            try:
                outcome: tuple[str, str | None] | BaseException = self.run(call)
            except BaseException as err:  # handed to the awaiting conversation, raised there
                outcome = err
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits for it
                loop.call_soon_threadsafe(settle, outcome)

        threading.Thread(target=work, name=f"{self._model}-call", daemon=True).start()
        timeout_s = CALL_TIMEOUT_S
        try:
            return await asyncio.wait_for(answered, timeout_s)
        except TimeoutError:
            self.abandoned = True
            return f"{EXECUTION_ERROR}the call did not finish within {timeout_s:g} s", "timeout"

    def close(self) -> None:
        prefix = re.sub(r"[-./:]", "_", f"{self._model}_")
        for key in [k for k in vars(self._utils) if k.startswith(prefix)]:
            del vars(self._utils)[key]


def _binds(method: Any, arguments: dict) -> bool:
    try:
        inspect.signature(method).bind(**arguments)
    except TypeError:
        return False
    return True


def _error_result(text: str) -> bool:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return False
    return isinstance(value, dict) and set(value) == {"error"}


def executed_messages(row: dict, ground_truth: list[list[str]] | None, long_context: bool = False) -> list[dict]:
    """The conversation with each user turn's ground-truth calls made one per assistant turn (a call
    can depend on the state the one before it left: ``cd`` then ``mv``), each followed by its result
    from the wheel's API classes, loaded with the row's ``initial_config``."""
    if ground_truth is None:
        raise BfclError("no ground truth in possible_answer")
    if len(ground_truth) != len(row["question"]):
        raise BfclError(f"{len(ground_truth)} ground-truth turns for {len(row['question'])} user turns")
    methods = _instances(row["involved_classes"], row.get("initial_config", {}), long_context)
    messages: list[dict] = []
    count = 0
    for turn, calls in zip(row["question"], ground_truth, strict=True):
        messages.extend(turn)
        for text in calls:
            name, arguments, result = _execute(text, methods)
            call_id = f"call_{count}"
            count += 1
            messages.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": call_id, "type": "function",
                 "function": {"name": tool_name(name), "arguments": json.dumps(arguments)}}]})
            messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
    return messages


def _instances(classes: list[str], initial_config: dict, long_context: bool) -> dict[str, Any]:
    """Public method name -> bound method of the row's fresh class instances (BFCL's own loading:
    stateless classes take no scenario; a later class's method shadows an earlier one's, as there)."""
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING, STATELESS_CLASSES

    methods: dict[str, Any] = {}
    for cls in classes:
        instance = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[cls]), cls)()
        if cls not in STATELESS_CLASSES:
            instance._load_scenario(copy.deepcopy(initial_config.get(cls, {})), long_context=long_context)
        methods.update((n, m) for n, m in inspect.getmembers(instance, inspect.ismethod) if not n.startswith("_"))
    return methods


def _execute(text: str, methods: dict[str, Any]) -> tuple[str, dict, str]:
    """A ground-truth call string (``mv(source='a', destination='b')``) parsed, never ``eval``-ed, and
    run: its function name, its arguments by parameter name, and the result as BFCL renders it."""
    call = ast.parse(text.strip(), mode="eval").body
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
        raise BfclError(f"{text!r} is not a plain function call")
    method = methods.get(call.func.id)
    if method is None:
        raise BfclError(f"{text!r}: no class of the row has {call.func.id!r}")
    args = [ast.literal_eval(a) for a in call.args]
    kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg is not None}
    arguments = dict(inspect.signature(method).bind(*args, **kwargs).arguments)
    result = method(*args, **kwargs)
    if isinstance(result, str):
        return call.func.id, arguments, result
    try:
        return call.func.id, arguments, json.dumps(result) if isinstance(result, dict) else str(result)
    except TypeError:  # a dict holding an object: BFCL falls back to str() too
        return call.func.id, arguments, str(result)


def _class_docs(data: Traversable, cls: str) -> list[dict]:
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    return list(_jsonl(data / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[cls]))


def data_dir(category: str) -> Traversable:
    """The wheel's data folder; a clear error for an unknown category or a missing wheel."""
    if category not in CATEGORIES:
        raise BfclError(f"bfcl:{category}: unknown category (known: {', '.join(CATEGORIES)})")
    try:
        from importlib.resources import files

        return files("bfcl_eval") / "data"
    except ModuleNotFoundError:
        raise BfclError(f"bfcl:{category}: the bfcl-eval package is not installed ({INSTALL})") from None


def _jsonl(path: Traversable) -> Iterator[dict]:
    """BFCL's ``.json`` files are JSON Lines."""
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)
