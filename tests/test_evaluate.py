import pytest

from draftsmith.evaluation import evaluate as ev
from draftsmith.evaluation.evaluate import acceptance

# An excerpt of vLLM 0.32's /metrics text with speculative decoding on.
METRICS = """
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 30.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 12.0
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 7.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 4.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 1.0
"""


def test_tau_is_pooled_from_counter_deltas(monkeypatch):
    import httpx

    from draftsmith.evaluation import evaluate

    monkeypatch.setattr(httpx, "get", lambda url, timeout: httpx.Response(200, text=METRICS))
    after = evaluate.scrape_spec_counters("http://x")
    assert after == {"num_drafts": 10, "num_draft_tokens": 30, "num_accepted_tokens": 12,
                     "per_pos_0": 7, "per_pos_1": 4, "per_pos_2": 1}
    before = {"num_drafts": 2, "num_draft_tokens": 6, "num_accepted_tokens": 2, "per_pos_0": 2, "per_pos_1": 0,
              "per_pos_2": 0}
    res = acceptance(before, after)
    assert res["tau_pooled"] == 1 + 10 / 8
    assert res["acceptance_rate_per_position"] == [5 / 8, 4 / 8, 1 / 8]


def test_no_drafts_gives_no_tau_rather_than_a_fake_one():
    assert acceptance({}, {"num_drafts": 0.0})["tau_pooled"] is None


def test_t1_runs_are_seeded_only_where_the_engine_can_rewind_a_generator():
    assert ev.sampling(64, 1.0, seeded=True) == {"max_tokens": 64, "temperature": 1.0, "seed": 0}
    assert "seed" not in ev.sampling(64, 1.0, seeded=False)


def test_a_drafter_is_evaluated_against_the_baseline_measured_for_the_same_sets_only():
    from draftsmith.data.datasets import Prompt

    sets = {"held": [Prompt("a", ["hi"]), Prompt("b", ["yo"])]}
    baseline = {"max_tokens": 32, "runs": [
        {"set": "held", "temperature": t, "prompts": 2, "baseline": {"output_tok_s": 40.0}} for t in (0.0, 1.0)]}
    runs = ev.runs_from_baseline(baseline, "baseline.json", sets, [0.0, 1.0], 32)
    assert list(runs) == [("held", 0.0), ("held", 1.0)] and runs["held", 0.0]["drafters"] == {}
    runs["held", 0.0]["drafters"]["finetuned"] = {"output_tok_s": 50.0}
    ev.add_speedups(list(runs.values()))
    assert runs["held", 0.0]["drafters"]["finetuned"]["speedup"] == 1.25
    # Another length, another temperature list, or a set that grew: refused, naming the file.
    for temperatures, max_tokens, grown in (([0.0, 1.0], 64, []), ([0.0], 32, []), ([0.0, 1.0], 32, ["c"])):
        bigger = {"held": sets["held"] + [Prompt(i, ["x"]) for i in grown]}
        with pytest.raises(ValueError, match=r"^baseline.json: measured for"):
            ev.runs_from_baseline(baseline, "baseline.json", bigger, temperatures, max_tokens)
