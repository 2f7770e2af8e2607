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

Checks that can fail (counted per dataset, the job fails above the configured rates): the
prompt we render for each turn has as many tokens as the server counted (and the same ids when
the server returned them), and the supervised tokens of each turn spell the same text as the
token ids the model produced, where the server returned them (vLLM ``return_token_ids``). Same
text in other token ids is counted apart (``answer_retokenized``): a model does not always
tokenize canonically, and with thousands of tokens per answer nearly every answer has a spot
where it did not; that is no template error.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from draftsmith.atomic import atomic_path, write_jsonl
from draftsmith.digest import ids_digest

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
    answer_retokenized: int = 0  # same text, other token ids: the model's tokenization was not canonical
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
                "answer_retokenized": self.answer_retokenized, "examples": self.examples}


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


def build_rows(renderer: Renderer, messages: list[dict], turns: list[dict], layout: str) -> list[Row]:
    """Token rows for one conversation (``turns``: the per-assistant-turn facts from generation)."""
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
        enc = renderer.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = list(enc["input_ids"]), [a for a, _ in enc["offset_mapping"]]
        owner = [next((k for k, (s, e) in spans.items() if s <= a < e), None) for a in offsets]
        rows.append(Row(ids, [int(k is not None) for k in owner],
                        {k: [t for t, o in zip(ids, owner, strict=True) if o == k] for k in spans}))
    return rows


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
        if facts.get("token_ids") is not None:
            ours, produced = supervised[k], facts["token_ids"]
            text, model_text = renderer.tokenizer.decode(ours), renderer.tokenizer.decode(produced)
            first = next((j for j, (a, b) in enumerate(zip(text, model_text, strict=False)) if a != b),
                         min(len(text), len(model_text)))
            checks.note("answer", text == model_text, record_id, k,
                        f"the supervised text differs from the model's at character {first}: "
                        f"{text[first:first + 40]!r} vs {model_text[first:first + 40]!r}")
            checks.answer_retokenized += text == model_text and ours != produced


@dataclass
class TokenizeSettings:
    max_length: int = 2048
    reasoning: str = "template"
    multi_turn: str = "auto"
    max_prompt_mismatch_fraction: float = 0.01
    max_answer_mismatch_fraction: float = 0.05

    @classmethod
    def from_config(cls, cfg: dict) -> TokenizeSettings:
        return cls(**{k: v for k, v in cfg.items() if k in cls.__dataclass_fields__})


def tokenize_file(responses: Path, tokenizer_dir: str, out: Path, rejects_out: Path, dataset: str,
                  settings: TokenizeSettings, template_kwargs: dict | None = None) -> dict:
    """Tokenize a responses file into a parquet table; unusable records go to ``rejects_out``."""
    from transformers import AutoTokenizer

    renderer = Renderer(AutoTokenizer.from_pretrained(tokenizer_dir), template_kwargs)
    layout = choose_layout(renderer, settings.multi_turn, settings.reasoning)
    rows, rejects, checks = [], [], Checks()
    with responses.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            rec = json.loads(line)
            messages = prepare_messages(rec["messages"], settings.reasoning)
            turns = rec.get("turns", [])
            try:
                built = build_rows(renderer, messages, turns, layout)
            except TemplateError as err:
                rejects.append({"file": str(responses), "row": number, "id": rec["id"], "reason": str(err)})
                continue
            check_turns(renderer, messages, turns, built, checks, rec["id"])
            for row in built:
                row_id = rec["id"] if layout == "whole" else f"{rec['id']}#turn{next(iter(row.turn_tokens))}"
                ids, mask = row.input_ids[: settings.max_length], row.loss_mask[: settings.max_length]
                if not any(mask):
                    rejects.append({"file": str(responses), "row": number, "id": row_id,
                                    "reason": f"no assistant token within max_length={settings.max_length}"})
                    continue
                rows.append({"id": row_id, "prompt_id": rec["id"], "dataset": dataset, "input_ids": ids,
                             "loss_mask": mask, "seq_len": len(ids),
                             "truncated_to_max_length": len(row.input_ids) > settings.max_length})
    _enforce(checks, settings, responses)
    if rejects:
        log.warning("%s: %d rows rejected (see %s)", responses, len(rejects), rejects_out)
    write_parquet(rows, out)
    write_jsonl(rejects_out, rejects)
    return {"layout": layout, "rows": len(rows), "rejected": len(rejects),
            "tokens": sum(r["seq_len"] for r in rows), "assistant_tokens": sum(sum(r["loss_mask"]) for r in rows),
            "round_trip": checks.as_dict()}


def _enforce(checks: Checks, settings: TokenizeSettings, responses: Path) -> None:
    for kind, limit, meaning in (
            ("prompt", settings.max_prompt_mismatch_fraction,
             "the server rendered prompts differently from the target's template here (another template, "
             "other chat_template_kwargs, or a template that strips history differently)"),
            ("answer", settings.max_answer_mismatch_fraction,
             "the answer text does not re-tokenize to the tokens the model produced (a reasoning parser or "
             "template that changes whitespace or think tags, or a different tokenizer)")):
        if checks.rate(kind) > limit:
            raise RoundTripError(
                f"{responses}: {getattr(checks, f'{kind}_mismatched')} of {getattr(checks, f'{kind}_checked')} "
                f"turns fail the {kind} round trip ({checks.rate(kind):.1%}, above {limit:.1%}): {meaning}; "
                f"examples: {checks.examples}")


SCHEMA = pa.schema([("id", pa.string()), ("prompt_id", pa.string()), ("dataset", pa.string()),
                    ("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.int8())), ("seq_len", pa.int32()),
                    ("truncated_to_max_length", pa.bool_())])


def write_parquet(rows: list[dict], out: Path) -> None:
    with atomic_path(out) as tmp:
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), tmp)
