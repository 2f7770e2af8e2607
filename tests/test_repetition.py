"""Looping answers, seen: measured per row at tokenization, shown per dataset, dropped only when asked."""

import json

import pytest

from draftsmith.data import repetition
from draftsmith.data.chat import TokenizeSettings, tokenize_file


def test_a_loop_repeats_its_last_tokens_and_ordinary_text_does_not():
    assert repetition.repeated_share(list(range(40))) == 0.0
    loop = [7, 8, 9] * 20  # "(()()()…": after one period every 4-token window has been seen
    assert repetition.repeated_share(loop) == pytest.approx(54 / 57)
    assert repetition.repeated_share([1, 2, 3]) == 0.0  # shorter than the window: nothing to repeat
    assert repetition.answer_tokens([5, 6, 7, 8], [0, 1, 0, 1]) == [6, 8]
    summary = repetition.summary([0.0, 0.1, 0.2, 0.6, 0.95])
    assert summary["rows"] == 5 and summary["max"] == 0.95 and summary["above"] == {"0.3": 2, "0.5": 2,
                                                                                          "0.7": 1}


def records(path):
    loop = "(()" + "()" * 120
    rows = [{"id": "plain", "messages": [{"role": "user", "content": "Tell me about rivers."},
                                         {"role": "assistant", "content": "Rivers carry water from hills to the sea, "
                                          "shaping valleys, feeding farms and towns along their banks."}]},
            {"id": "loop", "messages": [{"role": "user", "content": "Balance the brackets."},
                                        {"role": "assistant", "content": loop}]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_tokenization_measures_every_answer_and_drops_looping_ones_only_when_asked(tokenizer, tmp_path):
    """The demo keeps greedy answers cut at max_tokens; two of its eight validation rows were loops that
    carried the deep draft steps. By default they are measured and kept; with a limit they are dropped,
    each as a reject with its share, and counted."""
    responses = records(tmp_path / "r.jsonl")
    kept = tokenize_file(responses, tokenizer, tmp_path / "a.parquet", tmp_path / "a.rej", "d", TokenizeSettings())
    assert kept["rows"] == 2 and kept["repetition"]["rows"] == 2 and kept["repetition"]["dropped"] == 0
    assert kept["repetition"]["max"] > 0.9 and kept["repetition"]["above"]["0.5"] == 1
    dropped = tokenize_file(responses, tokenizer, tmp_path / "b.parquet", tmp_path / "b.rej", "d",
                            TokenizeSettings(max_repetition=0.5))
    assert dropped["rows"] == 1 and dropped["repetition"]["dropped"] == 1 and dropped["repetition"]["limit"] == 0.5
    reject = json.loads((tmp_path / "b.rej").read_text())
    assert reject["id"] == "loop" and reject["row"] == 2 and "above tokenize.max_repetition 0.5" in reject["reason"]


def test_the_report_shows_each_datasets_loops_and_what_a_limit_would_drop():
    from draftsmith.evaluation.report import _repetition

    stats = {"everyday": {"repetition": {**repetition.summary([0.0, 0.05, 0.6, 0.8]), "dropped": 0, "limit": None}},
             "old": {"rows": 3}}  # tokenized before repetition was measured
    lines = _repetition(stats)
    assert "| everyday | 4 | 0.362 |" in lines[-1] and lines[-1].endswith("| 2 | 2 | 1 | – (no limit) |")
    assert not any(line.startswith("| old |") for line in lines)
    assert _repetition({"old": {"rows": 3}}) == []


def test_a_project_tokenized_before_the_limit_existed_is_not_tokenized_again():
    """A new key in the tokenize params would rerun tokenization, and everything after it, in every finished
    project: the limit enters the params only when it is set."""
    from draftsmith.config.load import result_view, validate_config
    from draftsmith.data.chat import tokenize_params
    from tests.test_config import MINIMAL

    section = result_view(validate_config(MINIMAL))["tokenize"]
    assert tokenize_params(section) == {"max_length": 2048, "reasoning": "template", "multi_turn": "auto"}
    assert tokenize_params({**section, "max_repetition": 0.5})["max_repetition"] == 0.5


def ids_and_mask(tokenizer, parts: list[tuple[str, bool]]) -> tuple[list[int], list[int]]:
    """A row from ``(text, supervised)`` parts, each tokenized on its own."""
    ids, mask = [], []
    for text, supervised in parts:
        tokens = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids += tokens
        mask += [int(supervised)] * len(tokens)
    return ids, mask


def long_answers() -> dict[str, str]:
    """Answers of 1-5K tokens that do not loop but reuse their 4-grams: code, a CSV, step-by-step reasoning."""
    import argparse
    from pathlib import Path

    reasoning = "".join(f"Check n = {n}: {n} squared is {n * n}, which is {'even' if n % 2 == 0 else 'odd'}, so the "
                        f"sum so far is {sum(i * i for i in range(n + 1))}. Wait, let me verify that again. "
                        for n in range(1, 60))
    return {"code": Path(argparse.__file__).read_text()[:16000],
            "csv": "\n".join(f"{i},{i * 37 % 101},2024-01-{i % 28 + 1:02d},ok,0.{i * 7 % 100:02d}" for i in range(400)),
            "reasoning": reasoning}


def test_long_code_reasoning_and_agent_rows_do_not_loop_and_real_loops_do(tokenizer):
    """On human ShareGPT answers the 4-gram share flagged 9.3% of those of 1-4K tokens, mostly code, configs, logs
    and CSV: the subset that chooses the checkpoint dropped long code. A loop is a span repeated back to back;
    an agent's turns, each a tool call like the last (a retried one too), are judged each on its own."""
    prompt = ("Please answer.", False)
    for name, text in long_answers().items():
        ids, mask = ids_and_mask(tokenizer, [prompt, (text, True)])
        assert len(ids) > 1000, name
        assert not repetition.is_looping(ids, mask), (name, repetition.cycled_share(ids))
    assert repetition.repeated_share(ids_and_mask(tokenizer, [(long_answers()["csv"], True)])[0]) > 0.5  # before
    call = '<tool_call>\n{{"name": "read_file", "arguments": {{"path": "src/module_{}.py"}}}}\n</tool_call>'
    agent = [prompt]
    for i in [*range(12), 11, 11]:  # the last call retried twice
        agent += [(call.format(i), True), (f"<tool_response>\ncontents of module {i}\n</tool_response>", False)]
    assert not repetition.is_looping(*ids_and_mask(tokenizer, agent))

    sentence = "The answer is that the river flows north because the valley slopes that way. "
    code = long_answers()["code"][:1500]
    loops = {"brackets": "(()" + "()" * 120, "sentence": code + sentence * 30,
             "numbers": "Let me list them: " + "3, 4, 2, 2, 3, 4, " * 60}
    for name, text in loops.items():
        assert repetition.is_looping(*ids_and_mask(tokenizer, [prompt, (text, True)])), name
    assert repetition.cycled_share([1, 2, 3] * 4) == 0.0  # shorter than a cycle: nothing to judge
    assert repetition.cycled_share([]) == 0.0
