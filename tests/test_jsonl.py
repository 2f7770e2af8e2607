"""One JSONL reader: whole files fail by file and line; appended logs survive a kill."""

import gzip
import json

import pytest

from draftsmith.core import jsonl


def test_a_file_that_must_be_whole_names_the_bad_line(tmp_path):
    path = tmp_path / "responses.jsonl"
    path.write_text('{"id": "a"}\n\n[1, 2]\n')
    with pytest.raises(jsonl.JsonlError, match=r"responses.jsonl: line 3: a JSON list, not an object"):
        list(jsonl.read(path))
    path.write_text('{"id": "a"}\n{"id": \n')
    with pytest.raises(jsonl.JsonlError, match=r"responses.jsonl: line 2: not valid JSON \(Expecting value at col"):
        list(jsonl.read(path))


def test_rows_of_a_users_file_come_with_their_line_numbers(tmp_path):
    path = tmp_path / "prompts.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8-sig") as fh:
        fh.write('{"prompt": "a"}\n\nnot json\n{"prompt": "b"}\n')
    rows = list(jsonl.lines(path))
    assert [n for n, _ in rows] == [1, 3, 4] and rows[0][1] == {"prompt": "a"}
    assert isinstance(rows[1][1], jsonl.JsonlError) and rows[1][1].reason.startswith("not valid JSON")


def test_an_append_after_a_kill_starts_a_line_of_its_own(tmp_path):
    log = tmp_path / "ledger.jsonl"
    jsonl.append(log, [{"seconds": 1.0}])
    with log.open("a") as fh:
        fh.write('{"seconds": 2')  # the next job was killed mid-write
    assert list(jsonl.read_appended(log)) == [{"seconds": 1.0}]
    jsonl.append(log, [{"seconds": 3.0}])
    assert list(jsonl.read_appended(log)) == [{"seconds": 1.0}, {"seconds": 3.0}]
    assert log.read_text() == json.dumps({"seconds": 1.0}) + "\n" + json.dumps({"seconds": 3.0}) + "\n"
    assert list(jsonl.read_appended(tmp_path / "none.jsonl")) == []
