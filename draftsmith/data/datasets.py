"""Read prompt sets into one shape: ``{"id": str, "turns": [user message, ...]}`` (plus a system prompt).

Accepted files: ``.jsonl``, ``.jsonl.gz``, ``.json`` (a list of rows) and ``.parquet``; a source
may also be ``package:<module>/<path>`` for a file that a PyPI package installs, or
``hf:<dataset id or folder>[@<split>]`` for anything ``datasets.load_dataset`` reads (a hub id
needs a machine that is online; the split defaults to ``train``). Row shapes:
OpenAI ``messages``, ShareGPT ``conversations`` (from/value), ``turns`` (user turns only, as in
MT-bench), or a plain prompt column. A row that cannot be read is a :class:`Reject` naming the
file, row number and field, never a silent drop.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftsmith.config.target import resolve_package_file
from draftsmith.core import jsonl
from draftsmith.core.digest import prompt_digest

SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "system": "system"}


@dataclass(frozen=True)
class Prompt:
    id: str
    turns: list[str]
    system: str | None = None


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
    if source.startswith("hf:"):
        return Path(source)  # kept verbatim; iter_rows hands it to datasets.load_dataset
    if source.startswith("package:"):
        return resolve_package_file(source)
    path = Path(source)
    return path if path.is_absolute() else base_dir / path


def iter_rows(path: Path) -> Iterator[tuple[int, Any]]:
    """Yield ``(row number, parsed row)``; a line that is not a JSON object yields its JsonlError."""
    name = path.name
    if str(path).startswith("hf:"):
        yield from enumerate(_load_hf(str(path).removeprefix("hf:")), start=1)
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


def parse_row(row: Any, fmt: str, prompt_field: str, max_prompt_chars: int) -> tuple[list[str], str | None]:
    """Return ``(user turns, system prompt)``; raise ``_BadField`` naming what is wrong."""
    if not isinstance(row, dict):
        raise _BadField("<row>", f"expected an object, got {type(row).__name__}")
    if fmt == "auto":
        fmt = next((f for f in ("messages", "conversations", "turns") if f in row), "prompt")
    system = None
    if fmt == "prompt":
        turns = [_text(row, prompt_field)]
    elif fmt == "turns":
        value = row.get("turns")
        if not isinstance(value, list) or not value:
            raise _BadField("turns", "expected a non-empty list of strings")
        turns = [_text({"turns": t}, "turns") for t in value]
    elif fmt in ("messages", "conversations"):
        turns, system = _chat_turns(row, fmt)
    else:
        raise ValueError(f"unknown prompt format {fmt!r}")
    for turn in turns:
        if len(turn) > max_prompt_chars:
            raise _BadField(fmt if fmt != "prompt" else prompt_field,
                            f"prompt is {len(turn)} characters, over the limit of {max_prompt_chars}")
    return turns, system


def _chat_turns(row: dict, fmt: str) -> tuple[list[str], str | None]:
    messages = row.get(fmt)
    if not isinstance(messages, list) or not messages:
        raise _BadField(fmt, "expected a non-empty list of messages")
    role_key, text_key = ("role", "content") if fmt == "messages" else ("from", "value")
    turns: list[str] = []
    system = None
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise _BadField(f"{fmt}[{i}]", "expected an object")
        role = SHAREGPT_ROLES.get(str(msg.get(role_key)))
        if role is None:
            raise _BadField(f"{fmt}[{i}].{role_key}", f"unknown role {msg.get(role_key)!r}")
        text = _text(msg, text_key, where=f"{fmt}[{i}].{text_key}")
        if role == "system":
            system = text
        elif role == "user":
            turns.append(text)
        # Assistant turns are regenerated by the target, so the dataset's own answers are dropped.
    if not turns:
        raise _BadField(fmt, "no user message")
    return turns, system


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
                 max_samples: int | None = None, max_prompt_chars: int = 100_000, skip: int = 0) -> PromptSet:
    """Read up to ``max_samples`` valid prompts from ``path`` after its first ``skip`` rows.

    Bad rows become rejects; duplicate ids are rejected too (resume-by-id needs unique ids).
    """
    result = PromptSet()
    seen: set[str] = set()
    for number, row in iter_rows(path):
        if number <= skip:
            continue
        if max_samples is not None and len(result.prompts) >= max_samples:
            break
        if isinstance(row, jsonl.JsonlError):
            result.rejects.append(Reject(str(path), number, "<line>", row.reason))
            continue
        try:
            turns, system = parse_row(row, fmt, prompt_field, max_prompt_chars)
        except _BadField as bad:
            result.rejects.append(Reject(str(path), number, bad.field_name, bad.reason))
            continue
        raw_id = row.get(id_field)
        pid = str(raw_id) if raw_id not in (None, "") else prompt_digest(turns, system)  # stable
        if pid in seen:
            result.rejects.append(Reject(str(path), number, id_field, f"duplicate id {pid!r}"))
            continue
        seen.add(pid)
        result.prompts.append(Prompt(pid, turns, system))
    return result


def load_configured(cfg: dict, base_dir: Path, apply_max_samples: bool = True) -> PromptSet:
    """Load a prompt source described by a validated config entry (dataset or evaluation set).

    A training dataset is read whole (``apply_max_samples=False``): generation stops at
    ``max_samples`` kept answers, so a dropped or failed prompt is replaced by the next one.
    """
    return load_prompts(resolve_source(cfg["source"], base_dir), fmt=cfg["format"], prompt_field=cfg["prompt_field"],
                        id_field=cfg["id_field"], max_samples=cfg["max_samples"] if apply_max_samples else None,
                        max_prompt_chars=cfg["max_prompt_chars"], skip=cfg["skip"])


def write_prompts(prompts: list[Prompt], dest: Path) -> None:
    """The normalised prompt file the generate rule reads."""
    from draftsmith.core.atomic import write_jsonl

    write_jsonl(dest, ({"id": p.id, "turns": p.turns, **({"system": p.system} if p.system else {})} for p in prompts))


def read_prompts(path: Path) -> list[Prompt]:
    return [Prompt(row["id"], row["turns"], row.get("system")) for _, row in jsonl.read(path)]
