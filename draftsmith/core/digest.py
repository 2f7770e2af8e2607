"""Content digests: what identifies a prompt, a token sequence or a settings slice, independent of
where the project lives (no paths, no timestamps)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any


def json_digest(value: Any, length: int = 16) -> str:
    """Digest of a JSON-serialisable value with sorted keys (the same settings always hash the same)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:length]


def ids_digest(ids: list[int]) -> str:
    """Digest of a token-id sequence, to compare what a server tokenized with what we tokenize."""
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:16]


def file_sha256(path: Path) -> str:
    """The full sha256 of a file (shards, checkpoints, mappings), read in 16 MiB chunks."""
    h = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def prompt_digest(turns: list[str], system: str | None, tools: list[dict] | None = None,
                  tool_steps: list[list[list[dict]]] | None = None, open_end: bool = False,
                  history: list[str] | None = None, environment: dict | None = None,
                  calls: str | None = None) -> str:
    """Digest of a prompt's content: a changed prompt gets a new answer even if its id stays. A row
    with tools is keyed on its tools, its tool results (with their calls' arguments) and whether its
    data stops at a call; a row without keeps the digest it had before tools were read, so no finished
    journal is answered again. A row answered on its own history is keyed on the dataset's answers too, and one
    whose answers write calls as text (``calls``) on that markup and the tools the calls are read against; a
    row with an environment (BFCL multi-turn) on it too."""
    if calls is not None:
        return json_digest(["history", system, turns, history, tools, calls])
    if history is not None:
        return json_digest(["history", system, turns, history])
    if tools is None and tool_steps is None:
        return json_digest([system, turns])
    if environment is not None:
        return json_digest([system, turns, tools, tool_steps, open_end, environment])
    return json_digest([system, turns, tools, tool_steps, open_end])
