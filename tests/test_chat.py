import asyncio
import copy
import functools
import json

import pyarrow.parquet as pq
import pytest

from draftsmith.data.chat import (
    Checks,
    Renderer,
    RoundTripError,
    TemplateError,
    TokenizeSettings,
    build_rows,
    check_turns,
    choose_layout,
    prepare_messages,
    tokenize_file,
)
from draftsmith.data.datasets import Prompt
from draftsmith.generation.generate import GenerationSettings, Outputs, generate, make_client
from tests.sim.reasoning_server import TEMPLATE, ReasoningSim, SimSettings


def supervised_text(tokenizer, row):
    return tokenizer.decode([t for t, m in zip(row.input_ids, row.loss_mask, strict=True) if m])


@pytest.fixture(scope="module")
def qwen3_tokenizer(tokenizer):
    """The embedded model's tokenizer with a Qwen3-style template written for the tests."""
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = TEMPLATE
    return tok


def test_only_assistant_text_and_its_end_token_are_supervised(tokenizer):
    messages = [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi there!"},
                {"role": "user", "content": "Again."}, {"role": "assistant", "content": "Hello again."}]
    renderer = Renderer(tokenizer)
    assert choose_layout(renderer, "auto", "template") == "whole"
    (row,) = build_rows(renderer, messages, [], "whole")
    assert supervised_text(tokenizer, row) == "Hi there!<|im_end|>Hello again.<|im_end|>"
    expected = tokenizer.apply_chat_template(messages, tokenize=True)
    expected = expected["input_ids"] if hasattr(expected, "keys") else expected
    assert row.input_ids == list(expected)
    unsupervised = tokenizer.decode([t for t, m in zip(row.input_ids, row.loss_mask, strict=True) if not m])
    assert "Say hi." in unsupervised and "<|im_start|>assistant" in unsupervised


def test_a_turn_cut_by_max_tokens_does_not_supervise_an_end_token_never_generated(tokenizer):
    messages = [{"role": "user", "content": "Count."}, {"role": "assistant", "content": "one two thr"}]
    (row,) = build_rows(Renderer(tokenizer), messages, [{"finish_reason": "length"}], "whole")
    assert supervised_text(tokenizer, row) == "one two thr"


def test_reasoning_modes():
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning": "r"}]
    assert prepare_messages(messages, "template")[1] == {"role": "assistant", "content": "a", "reasoning_content": "r"}
    assert prepare_messages(messages, "think_tags")[1]["content"] == "<think>\nr\n</think>\n\na"
    assert prepare_messages(messages, "drop")[1] == {"role": "assistant", "content": "a"}


CONVERSATION = [{"role": "user", "content": "What is 2+2?"},
                {"role": "assistant", "content": "4", "reasoning": "Two plus two."},
                {"role": "user", "content": "And 3+3?"},
                {"role": "assistant", "content": "6", "reasoning": "Three plus three."}]


def test_templates_that_strip_earlier_reasoning_get_one_row_per_turn(qwen3_tokenizer):
    renderer = Renderer(qwen3_tokenizer)
    messages = prepare_messages(CONVERSATION, "template")
    with pytest.raises(TemplateError, match="not prefix-stable"):
        build_rows(renderer, messages, [], "whole")
    assert choose_layout(renderer, "auto", "template") == "per_turn"
    first, second = build_rows(renderer, messages, [], "per_turn")
    assert supervised_text(qwen3_tokenizer, first) == "<think>\nTwo plus two.\n</think>\n\n4<|im_end|>"
    assert supervised_text(qwen3_tokenizer, second) == "<think>\nThree plus three.\n</think>\n\n6<|im_end|>"
    # The second row's history is what the model saw at inference: the first turn without its reasoning.
    history = qwen3_tokenizer.decode(second.input_ids)
    assert "Two plus two" not in history and "<|im_start|>assistant\n4<|im_end|>" in history


def generate_with(sim_settings, tmp_path, items, **gen):
    check = gen.pop("early_check", None)
    settings = GenerationSettings(max_tokens=gen.pop("max_tokens", 256), concurrency=4, request_timeout_s=30,
                                  return_token_ids=gen.pop("return_token_ids", True), **gen)
    out = Outputs(tmp_path / "r.jsonl", tmp_path / "s.json", tmp_path / "e.jsonl", tmp_path / "j.jsonl")
    with ReasoningSim(sim_settings) as sim:
        client = make_client(sim.base_url, "sim", settings, None, None)

        async def main():
            try:
                await generate(items, client, settings, out, max_samples=None, token_budget=None, dataset="d",
                               early_check=check)
            finally:
                await client.aclose()

        asyncio.run(main())
    return out.responses


@pytest.fixture(scope="module")
def qwen3_dir(qwen3_tokenizer, tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen3-style")
    qwen3_tokenizer.save_pretrained(folder)
    return folder


PROMPTS = [Prompt(f"p{i}", [f"Question {i}?", f"Follow-up {i}?"]) for i in range(12)]


def tokenize(responses, qwen3_dir, tmp_path, **kw):
    from transformers import AutoTokenizer

    return tokenize_file(responses, AutoTokenizer.from_pretrained(qwen3_dir), tmp_path / "t.parquet",
                         tmp_path / "rej.jsonl", "d", TokenizeSettings(**kw))


def test_round_trip_against_what_the_server_counted_and_produced(qwen3_tokenizer, qwen3_dir, tmp_path):
    sim = SimSettings(tokenizer=qwen3_tokenizer, reasoning_log_mean=3.0, content_log_mean=3.0)
    responses = generate_with(sim, tmp_path, PROMPTS)
    stats = tokenize(responses, qwen3_dir, tmp_path)
    assert stats["layout"] == "per_turn" and stats["rows"] == 24 and stats["rejected"] == 0
    trip = stats["round_trip"]
    assert trip["prompt_checked"] == 24 and trip["answer_checked"] == 24
    assert trip["prompt_mismatched"] == 0 and trip["answer_mismatched"] == 0, trip["examples"]


def test_a_server_that_renders_prompts_differently_fails_tokenization(qwen3_tokenizer, qwen3_dir, tmp_path):
    sim = SimSettings(tokenizer=qwen3_tokenizer, template_mismatch=True, reasoning_log_mean=3.0,
                      content_log_mean=3.0)
    responses = generate_with(sim, tmp_path, PROMPTS)
    with pytest.raises(RoundTripError, match="24 of 24 turns fail the prompt round trip"):
        tokenize(responses, qwen3_dir, tmp_path)
    assert not (tmp_path / "t.parquet").exists()


@pytest.mark.parametrize("think_format", ["compact", "missing"])
def test_answers_the_template_would_render_otherwise_train_on_the_models_own_tokens(
        think_format, qwen3_tokenizer, qwen3_dir, tmp_path):
    """compact: think tags without the template's newlines; missing: a random-weight Qwen3 answers
    without think tags, the parser files it all as reasoning and the template re-adds them. Both
    failed the answer round trip for every turn when the answer's text was re-rendered."""
    sim = SimSettings(tokenizer=qwen3_tokenizer, think_format=think_format, reasoning_log_mean=3.0,
                      content_log_mean=3.0)
    responses = generate_with(sim, tmp_path, PROMPTS)
    stats = tokenize(responses, qwen3_dir, tmp_path)
    trip = stats["round_trip"]
    assert trip["answer_mismatched"] == 0 and trip["answer_own_tokens"] == 24 and stats["rows"] == 24, trip
    records = {json.loads(line)["id"]: json.loads(line) for line in responses.read_text().splitlines()}
    for row in pq.read_table(tmp_path / "t.parquet").to_pylist():
        record_id, turn = row["id"].split("#turn")
        produced = records[record_id]["turns"][int(turn)]["token_ids"]
        assert [t for t, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m] == produced


def test_a_server_whose_tokenizer_is_not_the_targets_fails_the_answer_round_trip(qwen3_tokenizer, qwen3_dir,
                                                                                tmp_path):
    responses = generate_with(SimSettings(tokenizer=qwen3_tokenizer, reasoning_log_mean=3.0, content_log_mean=3.0),
                              tmp_path, PROMPTS)
    records = [json.loads(line) for line in responses.read_text().splitlines()]
    for record in records:  # the same text in another vocabulary: ids shifted by one
        for turn in record["turns"]:
            turn["token_ids"] = [t + 1 for t in turn["token_ids"]]
    responses.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(RoundTripError, match=r"24 of 24 turns fail the answer round trip.*tokenizer is not the target"):
        tokenize(responses, qwen3_dir, tmp_path)


def test_a_text_only_server_gets_the_answers_rendered_by_the_template(qwen3_tokenizer, qwen3_dir, tmp_path):
    responses = generate_with(SimSettings(tokenizer=qwen3_tokenizer, reasoning_log_mean=3.0, content_log_mean=3.0),
                              tmp_path, PROMPTS[:4], return_token_ids=False)
    stats = tokenize(responses, qwen3_dir, tmp_path)
    assert stats["rows"] == 8 and stats["round_trip"]["answer_own_tokens"] == 0
    assert stats["round_trip"]["prompt_checked"] == 8 and stats["round_trip"]["prompt_mismatched"] == 0


def test_an_answer_cut_inside_a_character_trains_on_the_bytes_the_model_produced(tokenizer):
    renderer = Renderer(tokenizer)
    ids = renderer.ids("Caf\u00e9 \U0001f600")
    cut = ids[:-1]  # the emoji's last byte-token is missing: what a cut by max_tokens leaves
    assert "\ufffd" in tokenizer.decode(cut)
    messages = [{"role": "user", "content": "Where?"},
                {"role": "assistant", "content": tokenizer.decode(cut).replace("\ufffd", "")}]  # vLLM holds it back
    turns = [{"finish_reason": "length", "token_ids": cut, "completion_tokens": len(cut)}]
    (row,) = build_rows(renderer, messages, turns, "per_turn")
    assert [t for t, m in zip(row.input_ids, row.loss_mask, strict=True) if m] == cut
    checks = Checks()
    check_turns(renderer, messages, turns, [row], checks, "r")
    assert checks.answer_checked == 1 and checks.answer_mismatched == 0, checks.examples


def test_cut_reasoning_round_trips_too(qwen3_tokenizer, qwen3_dir, tmp_path):
    sim = SimSettings(tokenizer=qwen3_tokenizer, reasoning_log_mean=5.0, log_sigma=0.1)
    responses = generate_with(sim, tmp_path, PROMPTS[:4], max_tokens=32)
    records = [json.loads(line) for line in responses.read_text().splitlines()]
    assert all(r["finish_reasons"] == ["length"] and r["messages"][-1]["content"] == "" for r in records)
    stats = tokenize(responses, qwen3_dir, tmp_path)
    assert stats["rows"] == 4 and stats["round_trip"]["answer_mismatched"] == 0, stats["round_trip"]


def test_a_mismatch_stops_generation_after_its_first_answers_not_its_budget(qwen3_tokenizer, tmp_path):
    from draftsmith.data.chat import early_check
    from draftsmith.generation.generate import EARLY_CHECK_ANSWERS, GenerationFailed

    sim = SimSettings(tokenizer=qwen3_tokenizer, template_mismatch=True, reasoning_log_mean=2.0, content_log_mean=2.0)
    prompts = [Prompt(f"p{i}", [f"Question {i}?"]) for i in range(400)]
    check = functools.partial(early_check, qwen3_tokenizer, settings=TokenizeSettings(), template_kwargs=None,
                              where="d")
    with pytest.raises(GenerationFailed, match=r"the first 32 answers: 32 of 32 turns fail the prompt round trip.*"
                                               r"target.chat_template_kwargs"):
        generate_with(sim, tmp_path, prompts, early_check=check)
    journaled = len((tmp_path / "j.jsonl").read_text().splitlines())
    assert EARLY_CHECK_ANSWERS <= journaled < EARLY_CHECK_ANSWERS + 8  # kept for a rerun; 4 were in flight
    assert not (tmp_path / "r.jsonl").exists()


TRAJECTORIES = [Prompt(f"t{i}", [f"Observation {i}.{k}" for k in range(3)], "You are an agent.",
                       history=[f"Action {i}.{k}" for k in range(2)]) for i in range(3)]


@pytest.mark.parametrize("multi_turn", ["whole", "per_turn"])
def test_a_trajectory_turn_is_one_row_that_supervises_its_last_turn_only(qwen3_tokenizer, qwen3_dir, tmp_path,
                                                                          multi_turn):
    """Issue 58: the assistant turns before a trajectory's turn are the dataset's actions, not the model's: its
    row supervises the model's answer alone, whatever tokenize.multi_turn says, and the round trip checks it."""
    sim = SimSettings(tokenizer=qwen3_tokenizer, reasoning_log_mean=2.0, content_log_mean=2.0)
    responses = generate_with(sim, tmp_path, TRAJECTORIES)
    stats = tokenize(responses, qwen3_dir, tmp_path, multi_turn=multi_turn)
    assert stats["rows"] == 9 and stats["rejected"] == 0
    assert stats["round_trip"]["prompt_checked"] == 9 and stats["round_trip"]["prompt_mismatched"] == 0
    table = pq.read_table(tmp_path / "t.parquet").to_pylist()
    assert [r["id"] for r in table[:3]] == ["t0#0", "t0#1", "t0#2"] and {r["prompt_id"] for r in table[:3]} == {"t0"}
    records = {r["id"]: r for r in map(json.loads, responses.read_text().splitlines())}
    for row in table:
        supervised = qwen3_tokenizer.decode([t for t, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m])
        assert "Action" not in supervised
        assert records[row["id"]]["messages"][-1]["content"] in supervised
