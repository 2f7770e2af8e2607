"""Decontamination before generation, pre-tokenized datasets, the split by prompt and mixture weights."""

import json

import pyarrow.parquet as pq
import pytest

from draftsmith.data import decontaminate as dc
from draftsmith.data.datasets import Prompt
from draftsmith.data.merge import TRAIN, VALIDATION, merge, train_ratio
from draftsmith.data.pretokenized import import_tokenized

EVAL = {"mt": [Prompt("m1", ["Compose an engaging travel blog post about a recent trip to Hawaii, highlighting "
                             "cultural experiences and must-see attractions."]),
               Prompt("m2", ["What is the capital of France?"])]}


def test_evaluation_prompts_and_duplicates_are_dropped_before_generation():
    index = dc.EvaluationIndex.build(EVAL, n=8)
    prompts = [
        Prompt("exact", ["what is the CAPITAL of   france?"]),  # case and whitespace folded
        Prompt("para", ["Please compose an engaging travel blog post about a recent trip to Hawaii, highlighting "
                        "cultural experiences and must-see attractions. Use a friendly tone."]),
        Prompt("other", ["Write a haiku about the sea."]),
        Prompt("again", ["write a HAIKU about  the sea."]),  # a duplicate within the dataset
        Prompt("code", ["check brackets like '<' and '>'"]),
        Prompt("code2", ["check brackets like '(' and ')'"]),  # punctuation matters: another task
        Prompt("earlier", ["Sort a list in Python."]),  # already in an earlier dataset
        Prompt("second-turn", ["Hello there.", "What is the capital of France?"]),
    ]
    earlier = {dc.prompt_key(Prompt("x", ["sort a list in python."])): "code/x"}
    sel = dc.select(prompts, index, max_overlap=0.5, earlier=earlier)
    assert [p.id for p in sel.kept] == ["other", "code", "code2"]
    assert sel.dropped == {"exact": 2, "ngram": 1, "duplicate": 2}
    reasons = {e["id"]: (e["reason"], e["matches"]) for e in sel.examples}
    assert reasons["para"] == ("ngram", "mt/m1") and reasons["earlier"] == ("duplicate", "code/x")
    assert reasons["again"][0] == "duplicate"


def test_short_prompts_are_only_compared_exactly():
    index = dc.EvaluationIndex.build({"s": [Prompt("a", ["Tell me a joke."])]}, n=8)
    assert dc.select([Prompt("b", ["Tell me a joke about cats."])], index, 0.5, None).kept


def table(path, dataset, prompts_rows):
    rows = [{"id": rid, "prompt_id": pid, "dataset": dataset, "input_ids": [1, 2, 3], "loss_mask": [0, 1, 1],
             "seq_len": 3, "truncated_to_max_length": False} for rid, pid in prompts_rows]
    from draftsmith.data.chat import write_parquet

    write_parquet(rows, path)
    return path


def test_the_split_is_by_prompt_and_made_once(tmp_path):
    # Per-turn rows of one conversation share a prompt_id: they must land in the same split.
    a = table(tmp_path / "a.parquet", "a", [(f"p{i}#turn{t}", f"p{i}") for i in range(30) for t in range(3)])
    b = table(tmp_path / "b.parquet", "b", [(f"q{i}", f"q{i}") for i in range(30)])
    stats = merge({"a": a, "b": b}, tmp_path / "m.parquet", seed=1, validation_fraction=0.2, weights={})
    merged = pq.read_table(tmp_path / "m.parquet").to_pylist()
    split_of = {}
    for row in merged:
        assert split_of.setdefault((row["dataset"], row["prompt_id"]), row["split"]) == row["split"]
    assert sum(s == VALIDATION for s in split_of.values()) == 15  # 20% of 60 prompts is 12: a quarter, at least
    splits = [r["split"] for r in merged]
    assert splits == sorted(splits, key=lambda s: s != TRAIN)  # training rows come first
    n_train = pq.read_table(tmp_path / "m.parquet").column("split").to_pylist().count(TRAIN)
    assert n_train == stats["train_rows"] and int(len(merged) * train_ratio(n_train, len(merged))) == n_train


def test_mixture_weights_resample_training_rows_only(tmp_path):
    a = table(tmp_path / "a.parquet", "a", [(f"p{i}", f"p{i}") for i in range(100)])
    b = table(tmp_path / "b.parquet", "b", [(f"q{i}", f"q{i}") for i in range(100)])
    stats = merge({"a": a, "b": b}, tmp_path / "m.parquet", seed=0, validation_fraction=0.1,
                  weights={"a": 0.5, "b": 2.5})
    a_stats, b_stats = stats["datasets"]["a"], stats["datasets"]["b"]
    a_train = 100 - a_stats["validation_rows"]
    b_train = 100 - b_stats["validation_rows"]
    assert a_stats["train_rows"] == round(a_train * 0.5) and b_stats["train_rows"] == 2 * b_train + round(b_train / 2)
    assert a_stats["validation_rows"] + b_stats["validation_rows"] == 32  # 10% of 200 is 20: at least 32
    assert a_stats["rows_before"] == 100 and a_stats["train_supervised_tokens"] == 2 * a_stats["train_rows"]
    again = merge({"a": a, "b": b}, tmp_path / "m2.parquet", seed=0, validation_fraction=0.1,
                  weights={"a": 0.5, "b": 2.5})
    assert again == stats  # seeded


def pretokenized_file(tmp_path, rows):
    path = tmp_path / "tok.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_pretokenized_rows_are_validated_against_the_target(tmp_path):
    path = pretokenized_file(tmp_path, [
        {"id": "ok", "input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]},
        {"id": "vocab", "input_ids": [1, 99], "loss_mask": [0, 1]},
        {"id": "len", "input_ids": [1, 2], "loss_mask": [1]},
        {"id": "none", "input_ids": [1, 2], "loss_mask": [0, 0]},
        {"id": "late", "input_ids": [1, 2, 3, 4, 5], "loss_mask": [0, 0, 0, 0, 1]},
        '{"id": "cut", "input_ids": [1,',
    ])
    cfg = {"source": str(path), "skip": 0, "max_samples": None, "id_field": "id"}
    stats, rejects = import_tokenized(cfg, tmp_path, "t", vocab_size=50, max_length=4, out=tmp_path / "t.parquet")
    assert stats["rows"] == 1 and stats["rejected"] == 5
    by_row = {r.row: (r.field, r.reason) for r in rejects}
    assert by_row[2] == ("input_ids", "token id 99 is outside the target's vocabulary (0..49)")
    assert by_row[3][0] == "loss_mask" and "as long as input_ids (2)" in by_row[3][1]
    assert by_row[4] == ("loss_mask", "no supervised token")
    assert by_row[5] == ("loss_mask", "no supervised token within tokenize.max_length=4")
    assert by_row[6][0] == "<line>" and all(r.file == str(path) for r in rejects)
    (row,) = pq.read_table(tmp_path / "t.parquet").to_pylist()
    assert row["prompt_id"] == "ok" and row["dataset"] == "t"


def test_a_speculators_prepared_folder_is_read(tmp_path):
    from datasets import Dataset

    Dataset.from_dict({"input_ids": [[1, 2, 3]], "loss_mask": [[0, 1, 1]], "seq_len": [3]}).save_to_disk(
        str(tmp_path / "prepared"))
    cfg = {"source": str(tmp_path / "prepared"), "skip": 0, "max_samples": None, "id_field": "id"}
    stats, rejects = import_tokenized(cfg, tmp_path, "p", 50, 16, tmp_path / "p.parquet")
    assert stats["rows"] == 1 and not rejects
    assert pq.read_table(tmp_path / "p.parquet").column("id").to_pylist() == ["row1"]


@pytest.mark.parametrize("weight", [0.5, 1.0, 3.0])
def test_resample_counts(weight):
    import random

    from draftsmith.data.merge import resample

    assert len(resample(list(range(10)), weight, random.Random(0))) == round(10 * weight)


def test_merge_refuses_an_empty_training_set(tmp_path):
    a = table(tmp_path / "a.parquet", "a", [])
    with pytest.raises(ValueError, match="no training rows"):
        merge({"a": a}, tmp_path / "m.parquet", 0, 0.1, {})


def test_validation_holds_enough_prompts_that_one_cannot_move_a_figure_by_half():
    """The demo validated on 8 rows; one looping row moved the third step's accuracy by half."""
    from draftsmith.data.merge import validation_prompts

    assert validation_prompts(81, 0.1) == 20  # the demo: a quarter of its prompts, not 8
    assert validation_prompts(1000, 0.1) == 100 and validation_prompts(200, 0.1) == 32
    assert validation_prompts(2, 0.1) == 1 and validation_prompts(1, 0.1) == 0
