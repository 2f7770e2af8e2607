"""Tokenize conversations with the target's chat template and an assistant-only loss mask.

The mask is found by rendering prefixes: for assistant message ``i`` the template rendered up to
message ``i-1`` with the generation prompt must be a prefix of the rendering up to ``i``; the
characters in between are what the assistant says (plus its end-of-turn token), everything else
(system prompt, user turns, role headers) is template boilerplate and is not supervised. Each
conversation is then checked to tokenize to exactly what ``apply_chat_template`` gives, so a
template that re-tokenizes differently fails loudly instead of shifting the mask.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from draftsmith.atomic import atomic_path, write_jsonl

log = logging.getLogger(__name__)

class TemplateError(ValueError):
    pass


@dataclass
class Tokenized:
    input_ids: list[int]
    loss_mask: list[int]


def prepare_messages(messages: list[dict], reasoning: str) -> list[dict]:
    """Carry captured reasoning into the messages the way the template expects it.

    ``template``: pass it as ``reasoning_content`` (Qwen3/DeepSeek-style templates render it);
    ``think_tags``: inline ``<think>…</think>`` before the answer; ``drop``: leave it out.
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


def _render(tokenizer, messages: list[dict], add_generation_prompt: bool, template_kwargs: dict) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                         **template_kwargs)


def assistant_spans(tokenizer, messages: list[dict], template_kwargs: dict) -> tuple[str, list[tuple[int, int]]]:
    """Return the rendered conversation and the character spans the assistant produced."""
    full = _render(tokenizer, messages, False, template_kwargs)
    spans = []
    for i, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        before = _render(tokenizer, messages[:i], True, template_kwargs)
        through = _render(tokenizer, messages[: i + 1], False, template_kwargs)
        if not through.startswith(before) or not full.startswith(through):
            raise TemplateError(f"chat template is not prefix-stable at message {i}: rendering the conversation "
                                "up to an assistant turn is not a prefix of the full rendering")
        end = len(through.rstrip())  # trailing newline after end-of-turn is never generated
        spans.append((len(before), end))
    return full, spans


def tokenize_conversation(tokenizer, messages: list[dict], template_kwargs: dict | None = None) -> Tokenized:
    template_kwargs = template_kwargs or {}
    text, spans = assistant_spans(tokenizer, messages, template_kwargs)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    expected = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=False,
                                             **template_kwargs)
    if isinstance(expected, dict) or hasattr(expected, "keys"):
        expected = expected["input_ids"]
    if list(enc["input_ids"]) != list(expected):
        raise TemplateError("tokenizing the rendered text differs from apply_chat_template(tokenize=True)")
    mask = [int(any(s <= start < e for s, e in spans)) for start, _ in enc["offset_mapping"]]
    return Tokenized(list(enc["input_ids"]), mask)


def tokenize_file(responses: Path, tokenizer_dir: str, out: Path, rejects_out: Path, dataset: str,
                  max_length: int, reasoning: str = "template", template_kwargs: dict | None = None) -> dict:
    """Tokenize a responses file into a parquet table; unusable records go to ``rejects_out``."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    rows, rejects = [], []
    with responses.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            rec = json.loads(line)
            try:
                tok = tokenize_conversation(tokenizer, prepare_messages(rec["messages"], reasoning), template_kwargs)
            except TemplateError as err:
                rejects.append({"file": str(responses), "row": number, "id": rec["id"], "reason": str(err)})
                continue
            ids, mask = tok.input_ids[:max_length], tok.loss_mask[:max_length]
            if not any(mask):
                rejects.append({"file": str(responses), "row": number, "id": rec["id"],
                                "reason": f"no assistant token within max_length={max_length}"})
                continue
            rows.append({"id": rec["id"], "dataset": dataset, "input_ids": ids, "loss_mask": mask,
                         "seq_len": len(ids), "truncated_to_max_length": len(tok.input_ids) > max_length})
    if rejects:
        log.warning("%s: %d records rejected (see %s)", responses, len(rejects), rejects_out)
    write_parquet(rows, out)
    write_jsonl(rejects_out, rejects)
    return {"rows": len(rows), "rejected": len(rejects),
            "tokens": sum(r["seq_len"] for r in rows), "assistant_tokens": sum(sum(r["loss_mask"]) for r in rows)}


SCHEMA = pa.schema([("id", pa.string()), ("dataset", pa.string()), ("input_ids", pa.list_(pa.int32())),
                    ("loss_mask", pa.list_(pa.int8())), ("seq_len", pa.int32()),
                    ("truncated_to_max_length", pa.bool_())])


def write_parquet(rows: list[dict], out: Path) -> None:
    with atomic_path(out) as tmp:
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), tmp)
