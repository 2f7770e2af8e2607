"""Looping answers, seen: measured per row at tokenization by the repeated span, shown per dataset, dropped only
when asked."""

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
    carried the deep draft steps. By default they are measured by the repeated span and kept; with a limit
    they are dropped, each as a reject with its share, and counted. The deprecated 4-gram limit still drops."""
    responses = records(tmp_path / "r.jsonl")
    kept = tokenize_file(responses, tokenizer, tmp_path / "a.parquet", tmp_path / "a.rej", "d", TokenizeSettings())
    assert kept["rows"] == 2 and kept["looping"]["rows"] == 2 and kept["looping"]["dropped"] == 0
    assert kept["looping"]["measure"] == "repeated span" and kept["looping"]["max"] > 0.9
    assert {key: kept["looping"][key] for key in repetition.looping_conditions()} == repetition.looping_conditions()
    assert kept["looping"]["above"][f"{repetition.CYCLE_LOOPING:g}"] == 1
    assert "repetition" not in kept  # one measure: the 4-gram share only where its deprecated limit asks for it
    dropped = tokenize_file(responses, tokenizer, tmp_path / "b.parquet", tmp_path / "b.rej", "d",
                            TokenizeSettings(max_looping=0.25))
    assert dropped["rows"] == 1 and dropped["looping"]["dropped"] == 1 and dropped["looping"]["limit"] == 0.25
    reject = json.loads((tmp_path / "b.rej").read_text())
    assert reject["id"] == "loop" and reject["row"] == 2 and "above tokenize.max_looping 0.25" in reject["reason"]
    old = tokenize_file(responses, tokenizer, tmp_path / "c.parquet", tmp_path / "c.rej", "d",
                        TokenizeSettings(max_repetition=0.5))
    assert old["rows"] == 1 and old["repetition"]["dropped"] == 1 and old["repetition"]["limit"] == 0.5
    assert old["repetition"]["ngram"] == repetition.NGRAM and old["looping"]["dropped"] == 0
    assert "above tokenize.max_repetition 0.5" in json.loads((tmp_path / "c.rej").read_text())["reason"]


def test_the_report_shows_each_datasets_loops_and_reads_a_finished_projects_4gram_share_as_it_is():
    from draftsmith.evaluation.render.report import _repetition

    spans = repetition.summary([0.0, 0.05, 0.3, 0.8], repetition.LOOPING_THRESHOLDS, measure="repeated span")
    stats = {"everyday": {"looping": {**spans, "dropped": 0, "limit": None}},
             "old": {"rows": 3}}  # tokenized before repetition was measured
    lines = _repetition(stats)
    assert repetition.looping_text() in lines
    assert "| everyday | 4 | 0.287 |" in lines[-1] and lines[-1].endswith("| 2 | 2 | 1 | – (no limit) |")
    assert not any(line.startswith("| old |") for line in lines)
    assert _repetition({"old": {"rows": 3}}) == []
    # the measure's conditions are the record's: the text says what this dataset was measured with
    other = {**spans, "max_period": 128, "min_cycle": 8, "looping_above": 0.4, "dropped": 0, "limit": None}
    said = _repetition({"everyday": {"looping": other}})
    assert "a span of up to 128 tokens repeated over 8 tokens" in " ".join(said) and "Above 0.4 a row" in " ".join(said)
    # a finished project's stats: the 4-gram share, its thresholds and limit as they were recorded
    recorded = {"rows": 4, "ngram": 4, "mean": 0.362, "p50": 0.325, "p90": 0.74, "max": 0.8,
                "above": {"0.3": 2, "0.5": 2, "0.7": 1}, "dropped": 1, "limit": 0.7}
    old = _repetition({"everyday": {"repetition": recorded}})
    assert "whose last 4 tokens already occurred earlier" in " ".join(old) and repetition.looping_text() not in old
    assert old[-1] == "| everyday | 4 | 0.362 | 0.325 | 0.740 | 0.800 | 2 | 2 | 1 | 1 (limit 0.7) |"


def test_a_project_tokenized_before_the_limits_existed_is_not_tokenized_again_and_the_old_one_warns(caplog):
    """A new key in the tokenize params would rerun tokenization, and everything after it, in every finished
    project: a limit enters the params only when it is set. The 4-gram limit still works where it is set, and
    says it is deprecated; a project that does not set it is told nothing."""
    from draftsmith.config.load import result_view, validate_config
    from draftsmith.data.chat import tokenize_params
    from tests.test_config import MINIMAL

    with caplog.at_level("WARNING", logger="draftsmith.config.load"):
        section = result_view(validate_config(MINIMAL))["tokenize"]
    assert not caplog.records
    assert tokenize_params(section) == {"max_length": 2048, "reasoning": "template", "multi_turn": "auto"}
    assert tokenize_params({**section, "max_looping": 0.25})["max_looping"] == 0.25
    with caplog.at_level("WARNING", logger="draftsmith.config.load"):
        old = result_view(validate_config({**MINIMAL, "tokenize": {"max_repetition": 0.5}}))["tokenize"]
    assert tokenize_params(old)["max_repetition"] == 0.5 and "max_looping" not in tokenize_params(old)
    assert [r.getMessage() for r in caplog.records] == [
        "tokenize.max_repetition is deprecated: its 4-gram share flags long code, configs and logs that do not "
        "loop; set tokenize.max_looping (the repeated span) instead"]


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
