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

What is supervised is what the model produced: where the server returned the answer's token ids
(vLLM ``return_token_ids``), those ids are the turn's supervised tokens, followed by the
template's end-of-turn marker when the model stopped on its own; the template renders only the
prompt and the history. Re-rendering the answer's text is the fallback for servers that return
text only (and for ``reasoning: drop``, which leaves the model's thinking out). So a thinking
block the parser split differently from the template, an answer cut inside a multi-byte
character or a non-canonical tokenization trains on the model's own tokens instead of failing.

Checks that can fail (counted per dataset, the job fails above the configured rates): the
prompt we render for each turn has as many tokens as the server counted (and the same ids when
the server returned them), and the model's token ids spell the text the server returned (another
tokenizer than the target's would not). :func:`early_check` runs the same checks on a generate
job's first answers, so a mismatch stops the job in its first minute, not after its budget.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from draftsmith.core import jsonl
from draftsmith.core.atomic import atomic_path, write_jsonl
from draftsmith.core.digest import ids_digest
from draftsmith.data.repetition import NGRAM, answer_tokens, repeated_share, summary

log = logging.getLogger(__name__)


class TemplateError(ValueError):
    pass


class RoundTripError(ValueError):
    pass


@dataclass
class Row:
    input_ids: list[int]
    loss_mask: list[int]
    turn_tokens: dict[int, list[int]]  # supervised token ids of each assistant turn (0-based) in this row


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
    ``<think>…</think>`` before the answer; ``drop``: leave it out.
    """
    out = []
    for msg in messages:
        msg = {k: v for k, v in msg.items() if k in ("role", "content", "reasoning")}
        reasoning_text = msg.pop("reasoning", None)
        if reasoning_text and msg["role"] == "assistant":
            if reasoning == "template":
                msg["reasoning_content"] = reasoning_text
            elif reasoning == "think_tags":
                msg["content"] = f"<think>\n{reasoning_text}\n</think>\n\n{msg['content']}"
        out.append(msg)
    return out


class Renderer:
    """The target's chat template with the configured arguments (one place for both)."""

    def __init__(self, tokenizer, template_kwargs: dict | None = None):
        self.tokenizer = tokenizer
        self.kwargs = template_kwargs or {}

    def text(self, messages: list[dict], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt, **self.kwargs)

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


def build_rows(renderer: Renderer, messages: list[dict], turns: list[dict], layout: str,
               own_tokens: bool = True) -> list[Row]:
    """Token rows for one conversation (``turns``: the per-assistant-turn facts from generation).

    With ``own_tokens`` and the model's token ids in ``turns``, each answer is those ids;
    otherwise its rendered text, tokenized."""
    assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    groups = [assistant] if layout == "whole" else [[i] for i in assistant]
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
                    else _rendered_row(renderer, text, spans))
    return rows


def _rendered_row(renderer: Renderer, text: str, spans: dict[int, tuple[int, int]]) -> Row:
    """The rendered text tokenized whole; the answers' characters supervised."""
    enc = renderer.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), [a for a, _ in enc["offset_mapping"]]
    owner = [next((k for k, (s, e) in spans.items() if s <= a < e), None) for a in offsets]
    return Row(ids, [int(k is not None) for k in owner],
               {k: [t for t, o in zip(ids, owner, strict=True) if o == k] for k in spans})


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
        checks.note("answer", ours == theirs, record_id, k,
                    f"the model's token ids spell {ours[first:first + 40]!r} at character {first} (whitespace "
                    f"aside), the server returned {theirs[first:first + 40]!r}")


@dataclass
class TokenizeSettings:
    max_length: int = 2048
    reasoning: str = "template"
    multi_turn: str = "auto"
    max_prompt_mismatch_fraction: float = 0.01
    max_answer_mismatch_fraction: float = 0.05
    max_repetition: float | None = None  # drop rows whose answers loop more (draftsmith.data.repetition)

    @classmethod
    def from_config(cls, cfg: dict) -> TokenizeSettings:
        return cls(**{k: v for k, v in cfg.items() if k in cls.__dataclass_fields__})


# Settings added after projects were tokenized, which enter the tokenize job's params only when set: a new key
# there would tokenize every finished project again, and retrain its drafter, for a setting it does not use.
ADDED_WHEN_SET = ("max_repetition",)


def tokenize_params(settings: dict) -> dict:
    """The tokenize job's params from the config's ``tokenize`` section (results-relevant keys)."""
    return {k: v for k, v in settings.items() if not (k in ADDED_WHEN_SET and v is None)}


def tokenize_file(responses: Path, tokenizer, out: Path, rejects_out: Path, dataset: str,
                  settings: TokenizeSettings, template_kwargs: dict | None = None) -> dict:
    """Tokenize a responses file into a parquet table; unusable records go to ``rejects_out``."""
    renderer = Renderer(tokenizer, template_kwargs)
    layout = choose_layout(renderer, settings.multi_turn, settings.reasoning)
    rows, rejects, checks, shares, looping = [], [], Checks(), [], 0
    for number, rec in jsonl.read(responses):
        try:
            built = _record_rows(renderer, rec, layout, settings, checks)
        except TemplateError as err:
            rejects.append({"file": str(responses), "row": number, "id": rec["id"], "reason": str(err)})
            continue
        for row in built:
            row_id = rec["id"] if layout == "whole" else f"{rec['id']}#turn{next(iter(row.turn_tokens))}"
            ids, mask = row.input_ids[: settings.max_length], row.loss_mask[: settings.max_length]
            if not any(mask):
                rejects.append({"file": str(responses), "row": number, "id": row_id,
                                "reason": f"no assistant token within max_length={settings.max_length}"})
                continue
            share = repeated_share(answer_tokens(ids, mask))
            shares.append(share)
            if settings.max_repetition is not None and share > settings.max_repetition:
                looping += 1
                rejects.append({"file": str(responses), "row": number, "id": row_id,
                                "reason": f"the answer loops: {share:.0%} of its positions repeat their last "
                                          f"{NGRAM} tokens, above tokenize.max_repetition "
                                          f"{settings.max_repetition:g}"})
                continue
            rows.append({"id": row_id, "prompt_id": rec["id"], "dataset": dataset, "input_ids": ids,
                         "loss_mask": mask, "seq_len": len(ids),
                         "truncated_to_max_length": len(row.input_ids) > settings.max_length})
    _enforce(checks, settings, str(responses))
    if rejects:
        log.warning("%s: %d rows rejected (see %s)", responses, len(rejects), rejects_out)
    write_parquet(rows, out)
    write_jsonl(rejects_out, rejects)
    if looping:
        log.warning("%s: %d looping answers dropped (tokenize.max_repetition %g)", responses, looping,
                    settings.max_repetition)
    return {"layout": layout, "rows": len(rows), "rejected": len(rejects),
            "tokens": sum(r["seq_len"] for r in rows), "assistant_tokens": sum(sum(r["loss_mask"]) for r in rows),
            "round_trip": checks.as_dict(), "repetition": {**summary(shares), "dropped": looping,
                                                           "limit": settings.max_repetition}}


def _record_rows(renderer: Renderer, record: dict, layout: str, settings: TokenizeSettings,
                 checks: Checks) -> list[Row]:
    """One generated record's rows, its turns checked into ``checks``."""
    messages = prepare_messages(record["messages"], settings.reasoning)
    turns = record.get("turns", [])
    rows = build_rows(renderer, messages, turns, layout, own_tokens=settings.reasoning != "drop")
    check_turns(renderer, messages, turns, rows, checks, record["id"])
    return rows


def early_check(tokenizer, records: list[dict], settings: TokenizeSettings, template_kwargs: dict | None,
                where: str) -> str | None:
    """The tokenize stage's round trip on a generate job's first answers: what is wrong (the likely
    cause and the setting), or None. A mismatch then costs a minute of generation, not the
    dataset's whole budget."""
    renderer = Renderer(tokenizer, template_kwargs)
    layout = choose_layout(renderer, settings.multi_turn, settings.reasoning)
    checks = Checks()
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
