"""JSON Lines, read and appended one way everywhere.

Two kinds of file. Files that must be whole (a user's prompt file, a responses file, a prompt
list): a line that is not a JSON object is an error naming the file and the line. Logs that jobs
append to (generation journals, the hidden-state index, time ledgers, validation metrics): a job
killed mid-write leaves its last line cut; :func:`append` drops such a tail before it writes,
:func:`read_appended` reads no record from it and skips a damaged line with a warning naming
it, so a kill costs that one record (its writer redoes it), never the records after it.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class JsonlError(ValueError):
    def __init__(self, path: Path, where: str, reason: str):
        super().__init__(f"{path}: {where}: {reason}")
        self.reason = reason


def _decode(raw: bytes | str) -> dict | str:
    """The record on one line, or why there is none."""
    try:
        record = json.loads(raw)
    except json.JSONDecodeError as err:
        return f"not valid JSON ({err.msg} at column {err.colno})"
    except ValueError as err:  # bytes that are not UTF-8
        return f"not valid JSON ({err})"
    return record if isinstance(record, dict) else f"a JSON {type(record).__name__}, not an object"


def lines(path: Path) -> Iterator[tuple[int, dict | JsonlError]]:
    """``(line number, record)`` of every non-empty line of a ``.jsonl`` (or ``.jsonl.gz``) file, the
    record being a :class:`JsonlError` where the line is not a JSON object: for callers that count
    bad rows as rejects. A byte-order mark is not part of line 1."""
    path = Path(path)
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8-sig") as fh:
        for number, line in enumerate(fh, start=1):
            if line.strip():
                record = _decode(line)
                yield number, record if isinstance(record, dict) else JsonlError(path, f"line {number}", record)


def read(path: Path) -> Iterator[tuple[int, dict]]:
    """``(line number, record)`` of a file that must be whole; a bad line raises :class:`JsonlError`."""
    for number, record in lines(path):
        if isinstance(record, JsonlError):
            raise record
        yield number, record


def parse_appended(data: bytes, path: Path, offset: int = 0) -> Iterator[dict]:
    """The records of an append-only log's bytes ``data``, read from byte ``offset`` of ``path`` (a
    line start). A last line without its newline is being written or was cut by a kill: not yet a
    record. A complete line that cannot be read is skipped with a warning naming where it is."""
    position = offset
    for raw in data.splitlines(keepends=True):
        if raw.endswith(b"\n") and raw.strip():
            record = _decode(raw)
            if isinstance(record, dict):
                yield record
            else:
                log.warning("%s: skipped the line at byte %d (cut by a kill?): %s", path, position, record)
        position += len(raw)


def read_appended(path: Path) -> Iterator[dict]:
    """Every record of an append-only log (nothing when it does not exist yet): :func:`parse_appended`."""
    path = Path(path)
    if path.exists():
        yield from parse_appended(path.read_bytes(), path)


def drop_cut_tail(path: Path) -> bool:
    """Remove a last line without its newline (cut by a kill), so the next append starts a line of
    its own; return whether there was one."""
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return False
    with path.open("rb+") as fh:
        fh.seek(-1, os.SEEK_END)
        if fh.read(1) == b"\n":
            return False
        fh.seek(0)
        fh.truncate(fh.read().rfind(b"\n") + 1)
    return True


def append(path: Path, records: Iterable[dict[str, Any]]) -> None:
    """Append records durably (fsync), after a cut tail is dropped."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    drop_cut_tail(path)
    with path.open("a", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        fh.flush()
        os.fsync(fh.fileno())
