"""Tokenize conversations with the target's chat template and an assistant-only loss mask.

The mask is found by rendering prefixes: for assistant message ``i`` the template rendered up to
message ``i-1`` with the generation prompt must be a prefix of the rendering up to ``i``; the
characters in between are what the assistant says (plus its end-of-turn token), everything else
(system prompt, user turns, role headers) is template boilerplate and is not supervised. A turn
cut by ``max_tokens`` is supervised only up to its last generated character: the model never
produced the end-of-turn token the template appends.

Two row layouts (``tokenize.multi_turn``):

- ``whole``: one row per conversation, every assistant turn supervised. Needs a template that is
  prefix-stable (rendering a conversation's start gives a prefix of rendering all of it).
- ``per_turn``: one row per assistant turn, its history rendered as the model sees it at
  inference and only that turn supervised. Templates that render reasoning only on the last
  assistant turn (Qwen3, Kimi) are not prefix-stable; this is the layout for them.
- ``auto`` (default): ``whole`` when a probe conversation is prefix-stable, else ``per_turn``.

A conversation trained on the model's own ids whose earlier answer the template renders otherwise than the
model wrote it (the parser read its calls, the template wrote them anew, and the server conditioned the later
turns on that) is tokenized ``per_turn`` under ``whole`` too, counted (:func:`rerendered_answer`): a whole
row would hold the model's raw ids where the server saw the template's rendering.

A record of a trajectory's turn (``"supervise": "last"``, answered on the dataset's history) is one row that
supervises its last turn only, whatever the layout: the assistant turns before it are the dataset's, not the
model's.

What is supervised is what the model produced: where the server returned the answer's token ids
(vLLM ``return_token_ids``), those ids are the turn's supervised tokens, followed by the
template's end-of-turn marker when the model stopped on its own; the template renders only the
prompt and the history. Re-rendering the answer's text is the fallback for servers that return
text only (and for ``reasoning: drop``, which leaves the model's thinking out). So a thinking
block the parser split differently from the template, an answer cut inside a multi-byte
character or a non-canonical tokenization trains on the model's own tokens instead of failing.

Conversations with tools (a record's ``tools`` and its assistant ``tool_calls`` answered by ``tool``
messages) are rendered by the template with ``tools=``: the mask covers every token the model
generated (its text, its reasoning and its tool-call markup), never a tool result or the tools'
definitions. A template that ignores them (SmolLM2's renders only role and content) is refused
before work by :func:`tool_template_problem`, unless ``tokenize.tool_rendering: text``, which
writes the exchange as plain text every template shows (:func:`text_rendering`).

Checks that can fail (counted per dataset, the job fails above the configured rates): the
prompt we render for each turn has as many tokens as the server counted (and the same ids when
the server returned them), and the model's token ids spell the text the server returned (another
tokenizer than the target's would not). :func:`early_check` runs the same checks on a generate
job's first answers, so a mismatch stops the job in its first minute, not after its budget.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from draftsmith.core import jsonl
from draftsmith.core.atomic import atomic_path, write_jsonl
from draftsmith.core.digest import ids_digest
from draftsmith.data.repetition import (
    LOOPING_THRESHOLDS,
    NGRAM,
    answer_tokens,
    looping_conditions,
    looping_share,
    repeated_share,
    summary,
)
from draftsmith.data.tool_calls import call_arguments

log = logging.getLogger(__name__)


class TemplateError(ValueError):
    pass


class RoundTripError(ValueError):
    pass


class ToolTemplateError(ValueError):
    """The chat template cannot render a dataset's tools: the whole dataset is refused, not a row."""


@dataclass
class Row:
    input_ids: list[int]
    loss_mask: list[int]
    turn_tokens: dict[int, list[int]]  # supervised token ids of each assistant turn (0-based) in this row
    result_tokens_supervised: int = 0  # supervised tokens inside a tool result's text (must stay 0)


@dataclass
class Checks:
    """Round-trip counts of one dataset."""

    prompt_checked: int = 0
    prompt_mismatched: int = 0
    answer_checked: int = 0
    answer_mismatched: int = 0
    answer_own_tokens: int = 0  # turns supervised on the token ids the model produced
    examples: list[dict] = field(default_factory=list)

    def note(self, kind: str, ok: bool, record_id: str, turn: int, detail: str) -> None:
        setattr(self, f"{kind}_checked", getattr(self, f"{kind}_checked") + 1)
        if not ok:
            setattr(self, f"{kind}_mismatched", getattr(self, f"{kind}_mismatched") + 1)
            if len(self.examples) < 5:
                self.examples.append({"id": record_id, "turn": turn, "check": kind, "detail": detail})

    def rate(self, kind: str) -> float:
        checked = getattr(self, f"{kind}_checked")
        return getattr(self, f"{kind}_mismatched") / checked if checked else 0.0

    def as_dict(self) -> dict:
        return {"prompt_checked": self.prompt_checked, "prompt_mismatched": self.prompt_mismatched,
                "answer_checked": self.answer_checked, "answer_mismatched": self.answer_mismatched,
                "answer_own_tokens": self.answer_own_tokens, "examples": self.examples}


def prepare_messages(messages: list[dict], reasoning: str) -> list[dict]:
    """Carry captured reasoning into the messages the way the template expects it.

    ``template``: pass it as ``reasoning_content`` (what vLLM hands the template for history
    turns too; Qwen3/DeepSeek/Kimi-style templates render it); ``think_tags``: inline
    ``<think>…</think>`` before the answer; ``drop``: leave it out. Tool calls and results keep
    ``tool_calls``, ``tool_call_id`` and ``name``, the calls' arguments as objects (what vLLM hands
    the template, so the prompts we render are the server's).
    """
    out = []
    for msg in messages:
        msg = {k: v for k, v in msg.items() if k in KEPT_KEYS}
        reasoning_text = msg.pop("reasoning", None)
        if reasoning_text and msg["role"] == "assistant":
            if reasoning == "template":
                msg["reasoning_content"] = reasoning_text
            elif reasoning == "think_tags":
                msg["content"] = _think_tagged(reasoning_text, msg.get("content"))
        if msg.get("tool_calls"):
            msg["tool_calls"] = [_with_object_arguments(call) for call in msg["tool_calls"]]
        elif "tool_calls" in msg:
            del msg["tool_calls"]  # an empty list: the template's plain answer path, as vLLM does
        out.append(msg)
    return out


KEPT_KEYS = ("role", "content", "reasoning", "tool_calls", "tool_call_id", "name")


def _think_tagged(reasoning_text: str, content: str | None) -> str:
    return f"<think>\n{reasoning_text}\n</think>\n\n{content or ''}"


def history_reasoning(messages: list[dict], reasoning: str) -> list[dict]:
    """A conversation as generation sends it to the server: its answers' reasoning as ``tokenize.reasoning``
    keeps it (:func:`prepare_messages`), so the prompt the server renders is the one the tokenize stage
    renders. ``template`` sends it as the answers' ``reasoning`` (vLLM hands it on to the template as
    ``reasoning_content``); ``think_tags`` inline in their content; ``drop`` not at all. Qwen3's template
    renders the reasoning of the answers after the last user turn, a tool stretch's earlier answers: sent
    where the row renders without it, the server's prompt was one no row holds."""
    if reasoning == "template":
        return messages
    out = []
    for msg in messages:
        if msg["role"] != "assistant" or not msg.get("reasoning"):
            out.append(msg)
            continue
        kept = {k: v for k, v in msg.items() if k != "reasoning"}
        if reasoning == "think_tags":
            kept["content"] = _think_tagged(msg["reasoning"], msg.get("content"))
        out.append(kept)
    return out


def _object_or_text(value) -> dict | str:
    """A call's arguments as an object where they read as one (:func:`call_arguments`), else as written."""
    parsed = call_arguments(value)
    return value if parsed is None else parsed


def _with_object_arguments(call: dict) -> dict:
    """A call as vLLM hands it to the template: its arguments an object, ``{}`` where they are not JSON of
    one (vLLM 0.32 ``_postprocess_messages``; empty arguments are left as they are)."""
    function = call.get("function", {})
    arguments = function.get("arguments")
    if not arguments:
        return call
    return {**call, "function": {**function, "arguments": call_arguments(arguments) or {}}}


TOOLS_INSTRUCTION = ("You may call one or more of these functions; for each call, reply with "
                     '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>.')


def text_rendering(messages: list[dict], tools: list[dict] | None) -> list[dict]:
    """A tools conversation as plain role/content messages, for a template that shows only those
    (Hermes' text format, as Glaive's own text was): the tools as a JSON list in the system prompt,
    each call as a ``<tool_call>`` block after the assistant's content, each run of tool results as
    one user turn of ``<tool_response>`` blocks. Other keys (``reasoning``) are kept; an answer
    whose calls are already text in its content stays as it is."""
    out: list[dict] = []
    if tools:
        described = f"<tools>\n{json.dumps(tools, ensure_ascii=False)}\n</tools>\n{TOOLS_INSTRUCTION}"
        system = next((m for m in messages[:1] if m["role"] == "system"), None)
        out.append({"role": "system", "content": f"{system['content']}\n\n{described}" if system else described})
        messages = messages[1:] if system else messages
    for msg in messages:
        plain = {k: v for k, v in msg.items() if k not in ("tool_calls", "tool_call_id", "name")}
        if msg["role"] == "tool":
            response = f"<tool_response>\n{msg.get('content') or ''}\n</tool_response>"
            if out and out[-1].get("tool_responses"):
                out[-1]["content"] += "\n" + response
            else:
                out.append({"role": "user", "content": response, "tool_responses": True})
            continue
        if msg.get("tool_calls"):
            blocks = [_call_block(call) for call in msg["tool_calls"]]
            plain["content"] = "\n".join(([msg["content"]] if msg.get("content") else []) + blocks)
        out.append(plain)
    return [{k: v for k, v in m.items() if k != "tool_responses"} for m in out]


def _call_block(call: dict) -> str:
    function = call.get("function", call)
    body = {"name": function["name"], "arguments": _object_or_text(function.get("arguments", {}))}
    return f"<tool_call>\n{json.dumps(body, ensure_ascii=False)}\n</tool_call>"


TOOL_CALL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def parse_text_tool_calls(content: str | None) -> list[dict]:
    """The ``{"name", "arguments"}`` calls of an answer's ``<tool_call>`` blocks (:func:`text_rendering`'s
    format), in order. A block that is not a JSON object with a name is no call: the model wrote it,
    no parser would read it."""
    calls = []
    for block in TOOL_CALL_BLOCK.findall(content or ""):
        try:
            call = json.loads(block)
        except json.JSONDecodeError:
            continue
        if isinstance(call, dict) and isinstance(call.get("name"), str) and call["name"]:
            calls.append({"name": call["name"], "arguments": _object_or_text(call.get("arguments", {}))})
    return calls


class Renderer:
    """The target's chat template with the configured arguments (one place for both)."""

    def __init__(self, tokenizer, template_kwargs: dict | None = None, tools: list[dict] | None = None):
        self.tokenizer = tokenizer
        self.kwargs = template_kwargs or {}
        self.tools = tools

    def with_tools(self, tools: list[dict] | None) -> Renderer:
        """The same template rendering a conversation's tools (none: exactly as without tools)."""
        return Renderer(self.tokenizer, self.kwargs, tools or None)

    def text(self, messages: list[dict], add_generation_prompt: bool) -> str:
        tools = {"tools": self.tools} if self.tools else {}
        return self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt, **self.kwargs, **tools)

    def ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def span(self, messages: list[dict], i: int) -> tuple[int, int]:
        """Character span of assistant message ``i`` in the rendering of ``messages[: i + 1]``."""
        before = self.text(messages[:i], True)
        through = self.text(messages[: i + 1], False)
        if not through.startswith(before):
            raise TemplateError(f"the rendering up to message {i} with the generation prompt is not a prefix of "
                                "the rendering through that assistant turn")
        return len(before), len(through.rstrip())  # a trailing newline after end-of-turn is never generated

    def is_prefix_stable(self, messages: list[dict]) -> bool:
        full = self.text(messages, False)
        return all(full.startswith(self.text(messages[: i + 1], False))
                   for i, m in enumerate(messages) if m["role"] == "assistant")


PROBE = [{"role": "user", "content": "first question"},
         {"role": "assistant", "content": "first answer", "reasoning": "first thoughts"},
         {"role": "user", "content": "second question"},
         {"role": "assistant", "content": "second answer", "reasoning": "second thoughts"}]


def choose_layout(renderer: Renderer, multi_turn: str, reasoning: str) -> str:
    if multi_turn != "auto":
        return multi_turn
    return "whole" if renderer.is_prefix_stable(prepare_messages(PROBE, reasoning)) else "per_turn"


PROBE_TOOLS = [{"type": "function", "function": {
    "name": "probe_lookup_7q", "description": "Look a word up.",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}}]
PROBE_CALL = [{"role": "user", "content": "Look up a word."},
              {"role": "assistant", "content": "", "tool_calls": [{
                  "id": "call_0", "type": "function",
                  "function": {"name": "probe_lookup_7q", "arguments": '{"word": "zebra-argument-5k"}'}}]},
              {"role": "tool", "tool_call_id": "call_0", "name": "probe_lookup_7q", "content": "probe-result-9x"},
              {"role": "assistant", "content": "Done."}]


def tool_template_problem(tokenizer, template_kwargs: dict | None, tool_rendering: str) -> str | None:
    """Why the target's chat template cannot train on conversations with tools, or None. A probe
    conversation (one tool, one call, one result), kept as :func:`prepare_messages` keeps it, must
    render the tool's name in the tools section, the call's arguments and the result's text: a
    template that renders only role and content (SmolLM2's) drops all three and would train the
    drafter on answers to tools it never saw. ``text`` rendering needs only role and content."""
    source = getattr(tokenizer, "name_or_path", "") or "the target's tokenizer"
    renderer = Renderer(tokenizer, template_kwargs)
    messages = PROBE_CALL
    if tool_rendering == "text":
        messages = text_rendering(messages, PROBE_TOOLS)
    else:
        renderer = renderer.with_tools(PROBE_TOOLS)
    try:
        tools_section = renderer.text(prepare_messages(messages[:1], "template"), True)
        whole = renderer.text(prepare_messages(messages, "template"), False)
    except Exception as err:  # a template that raises on a tool role or a call says so here
        return f"the chat template of {source} cannot render a conversation with tools: {type(err).__name__}: {err}"
    missing = [what for what, text, found in (("the tools' names", "probe_lookup_7q", tools_section),
                                              ("the tool calls' arguments", "zebra-argument-5k", whole),
                                              ("the tool results", "probe-result-9x", whole)) if text not in found]
    if not missing:
        return None
    how = ("tokenize.tool_rendering: text renders them as plain text, which this template drops too" if
           tool_rendering == "text" else "set tokenize.tool_rendering: text to write the tools, calls and results "
           "as text the template shows, or use a target whose template renders tools")
    return (f"the chat template of {source} ignores tools: its rendering of a probe conversation lacks "
            f"{' and '.join(missing)}; {how}")


def _cut_end(text: str, start: int, end: int, generated: dict) -> int:
    """End of what the model really generated in a turn cut by max_tokens (no end-of-turn token):
    the end of its last generated text, found verbatim (or as the template trimmed it)."""
    last = generated.get("content") or generated.get("reasoning_content") or ""
    for candidate in (last, last.strip()):
        found = text.rfind(candidate, start, end) if candidate.strip() else -1
        if found >= 0:
            return found + len(candidate)
    return end


END_PROBE = "\x00draftsmith-end-of-turn-probe\x00"


def _end_of_turn(renderer: Renderer, messages: list[dict], i: int) -> list[int]:
    """The token ids the template writes after assistant message ``i``'s text (its end-of-turn
    marker), found by rendering a probe answer in its place."""
    text = renderer.text([*messages[:i], {"role": "assistant", "content": END_PROBE}], False)
    return renderer.ids(text[text.rfind(END_PROBE) + len(END_PROBE):].rstrip())


def _own_tokens(renderer: Renderer, messages: list[dict], i: int, turn: dict) -> list[int]:
    """The model's token ids for a turn, ended by the template's end-of-turn marker when the model
    stopped on its own and the server did not already include it (vLLM does)."""
    ids = list(turn["token_ids"])
    if turn.get("finish_reason") == "length":
        return ids
    end = _end_of_turn(renderer, messages, i)
    return ids if not end or ids[-len(end):] == end else ids + end


LAST_TURN = "last"  # a record's own layout: one row, its last assistant turn supervised (a trajectory's turn)


def build_rows(renderer: Renderer, messages: list[dict], turns: list[dict], layout: str,
               own_tokens: bool = True, results: Sequence[tuple[int, str]] = ()) -> list[Row]:
    """Token rows for one conversation (``turns``: the per-assistant-turn facts from generation).

    With ``own_tokens`` and the model's token ids in ``turns``, each answer is those ids;
    otherwise its rendered text, tokenized. ``results``: the tool results' texts, in order, each
    after the number of assistant turns before it; a row counts their supervised tokens (a template
    that moved one into an answer would show there)."""
    assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    groups = [assistant] if layout == "whole" else [assistant[-1:]] if layout == LAST_TURN else [[i] for i in assistant]
    rows = []
    for group in groups:
        text = renderer.text(messages[: group[-1] + 1], False)
        spans = {}
        for i in group:
            start, end = renderer.span(messages, i)
            if not text.startswith(renderer.text(messages[: i + 1], False)):
                raise TemplateError(f"chat template is not prefix-stable at message {i}: use tokenize.multi_turn "
                                    "per_turn (or auto)")
            k = assistant.index(i)
            if k < len(turns) and turns[k].get("finish_reason") == "length":
                end = _cut_end(text, start, end, messages[i])
            spans[k] = (start, end)
        produced = own_tokens and all(k < len(turns) and turns[k].get("token_ids") is not None for k in spans)
        rows.append(_own_row(renderer, messages, turns, text, spans, assistant) if produced
                    else _rendered_row(renderer, text, spans,
                                       [r for n, r in results if n <= assistant.index(group[-1])]))
    return rows


def rerendered_answer(renderer: Renderer, messages: list[dict], turns: list[dict]) -> bool:
    """Whether an answer with tool calls before the last is rendered by the template otherwise than the model's
    own ids spell it (their markup re-written from the parsed calls: other spacing, key order, quoting). The
    server rendered the later prompts from the parsed calls, so a ``whole`` row of the model's ids would
    condition the later answers on a history the server never saw; ``per_turn`` rows hold the server's."""
    assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    for k, i in enumerate(assistant[:-1]):
        if not messages[i].get("tool_calls") or k >= len(turns) or turns[k].get("token_ids") is None:
            continue
        start, end = renderer.span(messages, i)
        rendered = renderer.text(messages[: i + 1], False)[start:end]
        if renderer.tokenizer.decode(_own_tokens(renderer, messages, i, turns[k])) != rendered:
            return True
    return False


def _rendered_row(renderer: Renderer, text: str, spans: dict[int, tuple[int, int]],
                  results: Sequence[str] = ()) -> Row:
    """The rendered text tokenized whole; the answers' characters supervised. (A row of the model's own
    ids supervises only those: a tool result's tokens there are always between the answers.)"""
    enc = renderer.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), [a for a, _ in enc["offset_mapping"]]
    owner = [next((k for k, (s, e) in spans.items() if s <= a < e), None) for a in offsets]
    in_result = _result_spans(text, results)
    leaked = sum(1 for a, k in zip(offsets, owner, strict=True)
                 if k is not None and any(s <= a < e for s, e in in_result))
    return Row(ids, [int(k is not None) for k in owner],
               {k: [t for t, o in zip(ids, owner, strict=True) if o == k] for k in spans}, leaked)


def _result_spans(text: str, results: Sequence[str]) -> list[tuple[int, int]]:
    """Character spans of the tool results in a rendering, found in order (those the row holds)."""
    spans, position = [], 0
    for result in results:
        found = text.find(result, position) if result.strip() else -1
        if found >= 0:
            spans.append((found, found + len(result)))
            position = found + len(result)
    return spans


def _own_row(renderer: Renderer, messages: list[dict], turns: list[dict], text: str,
             spans: dict[int, tuple[int, int]], assistant: list[int]) -> Row:
    """The template's text between the answers, tokenized; each answer the model's own ids."""
    ids: list[int] = []
    mask: list[int] = []
    turn_tokens: dict[int, list[int]] = {}
    position = 0
    for k, (start, end) in sorted(spans.items()):
        between = renderer.ids(text[position:start])
        answer = _own_tokens(renderer, messages, assistant[k], turns[k])
        ids += between + answer
        mask += [0] * len(between) + [1] * len(answer)
        turn_tokens[k] = answer
        # After a cut turn the template's end-of-turn text stands where the model wrote none.
        position = end if turns[k].get("finish_reason") != "length" else len(text.rstrip())
    rest = renderer.ids(text[position:].rstrip())
    return Row(ids + rest, mask + [0] * len(rest), turn_tokens)


def _spelled(text: str) -> str:
    """Text compared without whitespace, think tags or replacement characters (an answer cut inside
    a multi-byte character decodes to one; the server holds those bytes back)."""
    return "".join(text.replace("<think>", "").replace("</think>", "").replace("\ufffd", "").split())


def check_turns(renderer: Renderer, messages: list[dict], turns: list[dict], rows: list[Row], checks: Checks,
                record_id: str) -> None:
    """Compare what we render and supervise with what the server counted and produced."""
    assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    supervised = {k: tokens for row in rows for k, tokens in row.turn_tokens.items()}
    for k, i in enumerate(assistant[: len(turns)]):
        facts = turns[k]
        if facts.get("prompt_tokens"):
            prompt_ids = renderer.ids(renderer.text(messages[:i], True))
            ok = len(prompt_ids) == facts["prompt_tokens"] and \
                facts.get("prompt_ids_digest", ids_digest(prompt_ids)) == ids_digest(prompt_ids)
            checks.note("prompt", ok, record_id, k, f"we render {len(prompt_ids)} prompt tokens, the server "
                                                    f"counted {facts['prompt_tokens']}")
        if facts.get("token_ids") is None or k not in supervised:
            continue
        produced = facts["token_ids"]
        if supervised[k][: len(produced)] != produced:
            continue  # rendered text (reasoning: drop): the model's thinking is left out on purpose
        checks.answer_own_tokens += 1
        # The model's tokens must spell what the server returned: another tokenizer would not.
        returned = (messages[i].get("reasoning_content") or "") + (messages[i].get("content") or "")
        ours = _spelled(renderer.tokenizer.decode(produced, skip_special_tokens=True))
        theirs = _spelled(returned)
        first = next((j for j, (x, y) in enumerate(zip(ours, theirs, strict=False)) if x != y),
                     min(len(ours), len(theirs)))
        ok = ours == theirs
        if messages[i].get("tool_calls"):  # the parser took the calls out of the text: their markup follows it
            ok = ours.startswith(theirs) and all(
                _spelled(call["function"]["name"]) in ours[len(theirs):] for call in messages[i]["tool_calls"])
        checks.note("answer", ok, record_id, k,
                    f"the model's token ids spell {ours[first:first + 40]!r} at character {first} (whitespace "
                    f"aside), the server returned {theirs[first:first + 40]!r}")


@dataclass
class TokenizeSettings:
    max_length: int = 2048
    reasoning: str = "template"
    multi_turn: str = "auto"
    max_prompt_mismatch_fraction: float = 0.01
    max_answer_mismatch_fraction: float = 0.05
    max_looping: float | None = None  # drop rows whose answers loop more (draftsmith.data.repetition)
    max_repetition: float | None = None  # deprecated: the 4-gram share, which flags long code and logs
    tool_rendering: str = "template"  # conversations with tools: the template's own rendering, or text

    @classmethod
    def from_config(cls, cfg: dict) -> TokenizeSettings:
        return cls(**{k: v for k, v in cfg.items() if k in cls.__dataclass_fields__})


# Settings added after projects were tokenized, with their defaults: they enter the tokenize job's params only
# when set otherwise, as a new key there would tokenize every finished project again, and retrain its drafter,
# for a setting it does not use.
ADDED_DEFAULTS = {"max_repetition": None, "max_looping": None}


def tokenize_params(settings: dict) -> dict:
    """The tokenize job's params from the config's ``tokenize`` section (results-relevant keys), but
    ``tool_rendering``, which enters only a tool dataset's (:func:`draftsmith.data.datasets.tool_params`)."""
    return {k: v for k, v in settings.items()
            if k != "tool_rendering" and not (k in ADDED_DEFAULTS and v == ADDED_DEFAULTS[k])}


@dataclass
class ToolStats:
    """A dataset's tool figures. ``rows_with_tools``: conversations with tools that kept a row;
    ``tool_calls``: the model's calls in kept rows; ``tool_call_tokens``: supervised tokens of the
    assistant turns that made calls, whole turns (the calls' markup and any text beside it, so an
    upper bound of the tokens inside the calls); ``tool_result_tokens_supervised``: supervised tokens
    inside a tool result's text, 0 unless a template moved one into an answer; ``per_turn_rerendered``:
    conversations tokenized ``per_turn`` though the layout is ``whole``, as the template re-rendered an earlier
    call of the model's (:func:`rerendered_answer`)."""

    rows_with_tools: int = 0
    tool_calls: int = 0
    tool_call_tokens: int = 0
    tool_result_tokens_supervised: int = 0
    per_turn_rerendered: int = 0  # conversations tokenized per_turn under whole: an earlier call re-rendered

    def add(self, row: Row, calls: dict[int, int]) -> None:
        for k, tokens in row.turn_tokens.items():
            if calls.get(k):
                self.tool_calls += calls[k]
                self.tool_call_tokens += len(tokens)
        self.tool_result_tokens_supervised += row.result_tokens_supervised

    def as_dict(self) -> dict:
        return asdict(self)


def has_tools(record: dict) -> bool:
    """Whether a generated conversation has tools, calls or results (what the template must render)."""
    return bool(record.get("tools")) or any(m.get("tool_calls") or m.get("role") == "tool"
                                            for m in record["messages"])


def _call_counts(record: dict, tool_rendering: str) -> dict[int, int]:
    """The model's tool calls per assistant turn (0-based); in text rendering, its ``<tool_call>`` blocks."""
    answers = [m for m in record["messages"] if m["role"] == "assistant"]
    counts = {k: len(m.get("tool_calls") or []) for k, m in enumerate(answers)}
    if tool_rendering == "text":
        counts = {k: n or len(parse_text_tool_calls(answers[k].get("content"))) for k, n in counts.items()}
    return {k: n for k, n in counts.items() if n}


def _loop_tokens(ids: list[int], mask: list[int], row: Row, calls: dict[int, int]) -> list[int]:
    """The tokens whose repetition says an answer loops: the supervised ones, less the turns that made
    tool calls (an agent repeats its call JSON on purpose; such a row is measured on its text turns)."""
    if not any(k in calls for k in row.turn_tokens):
        return answer_tokens(ids, mask)
    return [t for k, tokens in sorted(row.turn_tokens.items()) if k not in calls for t in tokens]


def tokenize_file(responses: Path, tokenizer, out: Path, rejects_out: Path, dataset: str,
                  settings: TokenizeSettings, template_kwargs: dict | None = None) -> dict:
    """Tokenize a responses file into a parquet table; unusable records go to ``rejects_out``. The
    first conversation with tools checks that the template renders them (:func:`tool_template_problem`):
    a template that does not fails the dataset with :class:`ToolTemplateError` before any row is kept."""
    renderer = Renderer(tokenizer, template_kwargs)
    layout = choose_layout(renderer, settings.multi_turn, settings.reasoning)
    rows, rejects, checks, spans, ngrams = [], [], Checks(), [], []
    dropped = {"max_looping": 0, "max_repetition": 0}  # looping rows, by the key that dropped them
    tools, tools_checked = ToolStats(), False
    for number, rec in jsonl.read(responses):
        with_tools = has_tools(rec)
        if with_tools and not tools_checked:
            problem = tool_template_problem(tokenizer, template_kwargs, settings.tool_rendering)
            if problem:
                raise ToolTemplateError(f"{responses}: dataset {dataset!r} has tools, and {problem}")
            tools_checked = True
        try:
            built, rows_layout = _record_rows(renderer, rec, layout, settings, checks)
        except TemplateError as err:
            rejects.append({"file": str(responses), "row": number, "id": rec["id"], "reason": str(err)})
            continue
        tools.per_turn_rerendered += layout == "whole" and rows_layout == "per_turn"
        calls, kept = _call_counts(rec, settings.tool_rendering), 0
        for row in built:
            one_row = rows_layout in ("whole", LAST_TURN)
            row_id = rec["id"] if one_row else f"{rec['id']}#turn{next(iter(row.turn_tokens))}"
            ids, mask = row.input_ids[: settings.max_length], row.loss_mask[: settings.max_length]
            if not any(mask):
                rejects.append({"file": str(responses), "row": number, "id": row_id,
                                "reason": f"no assistant token within max_length={settings.max_length}"})
                continue
            loops = _loops(ids, mask, row, calls, settings, spans, ngrams)
            if loops:
                dropped[loops[0]] += 1
                rejects.append({"file": str(responses), "row": number, "id": row_id, "reason": loops[1]})
                continue
            # a trajectory's turns share its prefixes: one prompt for the split
            rows.append({"id": row_id, "prompt_id": rec.get("trajectory", rec["id"]), "dataset": dataset,
                         "input_ids": ids,
                         "loss_mask": mask, "seq_len": len(ids),
                         "truncated_to_max_length": len(row.input_ids) > settings.max_length})
            tools.add(row, calls)
            kept += 1
        tools.rows_with_tools += bool(with_tools and kept)
    _enforce(checks, settings, str(responses))
    if rejects:
        log.warning("%s: %d rows rejected (see %s)", responses, len(rejects), rejects_out)
    if tools.per_turn_rerendered:
        log.info("%s: %d conversations tokenized per turn: the template re-rendered an earlier tool call of the "
                 "model's, and the server saw that rendering", responses, tools.per_turn_rerendered)
    write_parquet(rows, out)
    write_jsonl(rejects_out, rejects)
    for key, count in dropped.items():
        if count:
            log.warning("%s: %d looping answers dropped (tokenize.%s %g)", responses, count, key,
                        getattr(settings, key))
    # the 4-gram share only where the deprecated limit asks for it
    ngram = {"repetition": {**summary(ngrams, ngram=NGRAM), "dropped": dropped["max_repetition"],
                            "limit": settings.max_repetition}} if settings.max_repetition is not None else {}
    return {"layout": layout, "rows": len(rows), "rejected": len(rejects),
            "tokens": sum(r["seq_len"] for r in rows), "assistant_tokens": sum(sum(r["loss_mask"]) for r in rows),
            "round_trip": checks.as_dict(),
            "looping": {**summary(spans, LOOPING_THRESHOLDS, measure="repeated span", **looping_conditions()),
                        "dropped": dropped["max_looping"], "limit": settings.max_looping}, **ngram,
            "tools": tools.as_dict()}


def _loops(ids: list[int], mask: list[int], row: Row, calls: dict[int, int], settings: TokenizeSettings,
           spans: list[float], ngrams: list[float]) -> tuple[str, str] | None:
    """The key that drops a row as looping and why, or None: its span share (:func:`looping_share`, appended to
    ``spans``) above ``tokenize.max_looping``, or its 4-gram share (appended to ``ngrams``, measured only where
    the deprecated ``tokenize.max_repetition`` is set) above that."""
    span = looping_share(ids, mask)
    spans.append(span)
    ngram = repeated_share(_loop_tokens(ids, mask, row, calls)) if settings.max_repetition is not None else None
    if ngram is not None:
        ngrams.append(ngram)
    if settings.max_looping is not None and span > settings.max_looping:
        return "max_looping", (f"the answer loops: {span:.0%} of its tokens repeat the span just before them, "
                               f"above tokenize.max_looping {settings.max_looping:g}")
    if ngram is not None and ngram > settings.max_repetition:
        return "max_repetition", (f"the answer loops: {ngram:.0%} of its positions repeat their last {NGRAM} "
                                  f"tokens, above tokenize.max_repetition {settings.max_repetition:g}")
    return None


def _record_rows(renderer: Renderer, record: dict, layout: str, settings: TokenizeSettings,
                 checks: Checks) -> tuple[list[Row], str]:
    """One generated record's rows and their layout, its turns checked into ``checks``. Its tools are rendered
    by the template, or (``tool_rendering: text``) written into the messages as generation sent them. Its own
    ids with an earlier call the template re-rendered go ``per_turn`` (:func:`rerendered_answer`)."""
    messages, tools = record["messages"], record.get("tools")
    if settings.tool_rendering == "text" and has_tools(record):
        messages, tools = text_rendering(messages, tools), None
    messages = prepare_messages(messages, settings.reasoning)
    renderer = renderer.with_tools(tools)
    turns = record.get("turns", [])
    if record.get("supervise") == LAST_TURN:  # the facts are the last turn's: the turns before are the dataset's
        layout = LAST_TURN
        turns = [{}] * (sum(m["role"] == "assistant" for m in messages) - len(turns)) + turns
    results, answered = [], 0
    for m in record["messages"]:
        answered += m["role"] == "assistant"
        if m["role"] == "tool":
            results.append((answered, m.get("content") or ""))
    own_tokens = settings.reasoning != "drop"
    if layout == "whole" and own_tokens and rerendered_answer(renderer, messages, turns):
        layout = "per_turn"
    rows = build_rows(renderer, messages, turns, layout, own_tokens=own_tokens, results=results)
    check_turns(renderer, messages, turns, rows, checks, record["id"])
    return rows, layout


def early_check(tokenizer, records: list[dict], settings: TokenizeSettings, template_kwargs: dict | None,
                where: str) -> str | None:
    """The tokenize stage's round trip on a generate job's first answers: what is wrong (the likely
    cause and the setting), or None. A mismatch then costs a minute of generation, not the
    dataset's whole budget."""
    renderer = Renderer(tokenizer, template_kwargs)
    layout = choose_layout(renderer, settings.multi_turn, settings.reasoning)
    checks = Checks()
    problem = any(has_tools(r) for r in records) and tool_template_problem(tokenizer, template_kwargs,
                                                                             settings.tool_rendering)
    if problem:
        return f"{where}: {problem}"
    try:
        for record in records:
            _record_rows(renderer, record, layout, settings, checks)
        _enforce(checks, settings, f"{where}: the first {len(records)} answers")
    except TemplateError as err:
        return f"{where}: answer {record['id']}: {err}"
    except RoundTripError as err:
        return str(err)
    log.info("%s: the first %d answers pass the round trip (%s)", where, len(records), checks.as_dict())
    return None


ROUND_TRIP_CAUSES = {
    "prompt": "the server rendered the prompts differently from the target's chat template: another template "
              "(the served model is not target.source, or the server has its own --chat-template), other "
              "template arguments (target.chat_template_kwargs, e.g. enable_thinking, must be what the "
              "server gets), or a template that renders the history differently; fix that setting, or accept "
              "the difference with tokenize.max_prompt_mismatch_fraction",
    "answer": "the model's token ids do not spell the text the server returned: the server's tokenizer is not "
              "the target's (generation_server.served_model or target.source names another model)",
}


def _enforce(checks: Checks, settings: TokenizeSettings, where: str) -> None:
    for kind, limit in (("prompt", settings.max_prompt_mismatch_fraction),
                        ("answer", settings.max_answer_mismatch_fraction)):
        if checks.rate(kind) > limit:
            raise RoundTripError(
                f"{where}: {getattr(checks, f'{kind}_mismatched')} of {getattr(checks, f'{kind}_checked')} "
                f"turns fail the {kind} round trip ({checks.rate(kind):.1%}, above {limit:.1%}): "
                f"{ROUND_TRIP_CAUSES[kind]}; examples: {checks.examples}")


SCHEMA = pa.schema([("id", pa.string()), ("prompt_id", pa.string()), ("dataset", pa.string()),
                    ("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.int8())), ("seq_len", pa.int32()),
                    ("truncated_to_max_length", pa.bool_())])


def write_parquet(rows: list[dict], out: Path) -> None:
    with atomic_path(out) as tmp:
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), tmp)
