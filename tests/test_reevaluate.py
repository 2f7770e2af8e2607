"""benchmarks/reevaluate.py's pure parts: the widened evaluation and its table of repeats."""

import importlib.util

import pytest

from tests.conftest import REPO

spec = importlib.util.spec_from_file_location("reevaluate", REPO / "benchmarks" / "reevaluate.py")
reevaluate = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reevaluate)

EVALUATION = {"max_tokens": 64, "concurrency": [12],
              "prompt_sets": {"humaneval": {"source": "h.jsonl", "skip": 140, "max_samples": 12},
                              "everyday": {"source": "e.jsonl"}}}


def test_only_the_chosen_sets_are_kept_and_widened():
    widened = reevaluate.widened(EVALUATION, ["humaneval"], 0, 164)
    assert widened["prompt_sets"] == {"humaneval": {"source": "h.jsonl", "skip": 0, "max_samples": 164}}
    assert EVALUATION["prompt_sets"]["humaneval"]["skip"] == 140  # the config itself is left as it was
    unchanged = reevaluate.widened(EVALUATION, ["everyday"], None, None)
    assert unchanged["prompt_sets"] == {"everyday": {"source": "e.jsonl"}}


def test_a_set_the_config_lacks_is_named():
    with pytest.raises(SystemExit, match=r"no evaluation set \['mbpp'\]"):
        reevaluate.widened(EVALUATION, ["humaneval", "mbpp"], None, None)


def test_the_table_gives_each_repeat_then_mean_and_half_range():
    rows = [{"run": "fp8-seed2", "set": "humaneval", "prompts": 164, "temperature": 1.0, "tau": tau}
            for tau in (1.30, 1.40, 1.35)]
    assert reevaluate.table(rows)[2] == "| fp8-seed2 | humaneval | 164 | 1 | 1.300, 1.400, 1.350 | 1.350 | 0.050 |"
