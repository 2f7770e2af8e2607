"""The plan: the worked example of the README (a 1T target that does not fit) and the estimates."""

import dataclasses
import json

import pytest

from draftsmith.config.load import load_layers, validate_config
from draftsmith.config.target import Facts
from draftsmith.core.units import human_bytes
from draftsmith.data.datasets import Prompt
from draftsmith.ops import plan
from tests.conftest import REPO

KIMI = Facts(num_layers=61, hidden_size=7168, vocab_size=163840, max_position_embeddings=262144, model_type="kimi_k2")


def kimi_config(tmp_path):
    user = {"datasets": {"regenerated": {"source": "prompts.jsonl", "generation": {"max_tokens": 8192}}},
            "tokenize": {"max_length": 10240},  # block families at speculators' recipe, not the demo's CPU sizes
            "train": {"total_seq_len": 10240, "epochs": 5, "gpus": 1,
                      "dflash": {"num_layers": None, "block_size": None}},
            "server": {"max_model_len": 16384, "gpus": 8},
            "plan": {"free_tb": 2.9, "gpu_hour_cost": 2.5,
                     "throughput": {"generation_tok_s": 6000, "extraction_tok_s": 40000, "training_tok_s": 30000}}}
    path = tmp_path / "kimi.yaml"
    path.write_text(json.dumps(user))
    return validate_config(load_layers([REPO / "config" / "config.yaml", path], {}))


def test_the_worked_example_lands_near_the_hand_estimate_and_does_not_fit(tmp_path):
    config = kimi_config(tmp_path)
    prompts = [Prompt(f"p{i}", ["x"]) for i in range(25_000)]
    ds = plan.plan_dataset("regenerated", config["datasets"]["regenerated"], prompts, prompt_tokens=150,
                           fraction=0.5, journal_dir=tmp_path / "none", max_length=10240)
    assert ds.completion_per_sample == 4096 and ds.samples == 25_000
    throughput = plan.measured_throughput(tmp_path / "results", config["plan"]["throughput"])
    markdown, data = plan.render([ds], KIMI, config, throughput, 2.9e12, "plan.free_tb")
    # The hand estimate: 25K samples x ~4K completion tokens x (3 + 1) x 7168 x 2 bytes = 5.87e12 B = 5.3 TiB.
    assert data["needed_bytes"] == pytest.approx(25_000 * (4096 + 150) * (4 * 7168 * 2 + 8), rel=1e-6)
    assert 5.2 < data["needed_bytes"] / 2**40 < 6.0  # TiB, vs ~5.4 estimated by hand
    assert not data["fits"] and "**it does not fit.**" in markdown
    assert "hidden_states: {mode: online}" in markdown and "about 11,313 fit" in markdown
    # the replay reads 2^17 positions, but no fewer than 32 rows that do not loop (2^17 / 4,246 is 31)
    assert "replays the drafter on about 32 of them (at most 256 rows and 131,072 positions" in markdown
    assert "| generate | 102,400,000 completion tokens | 6,000 tok/s (configured) | 4.7 h | 95 |" in markdown
    assert "| train eagle3 | 530,750,000 sequence tokens x epochs | 30,000 tok/s (configured) | 4.9 h | 12 |" \
        in markdown
    # fp8 storage: half the bytes (a float32 scale per token and layer on top), still above 2.9 TB here.
    assert data["fp8_bytes"] == pytest.approx(25_000 * (4096 + 150) * (4 * (7168 + 4) + 8), rel=1e-6)
    assert 0.50 < data["fp8_bytes"] / data["needed_bytes"] < 0.51
    assert "in fp8: 3.05 TB" in markdown and "about 22,611 of the 25,000 rows fit, not enough" in markdown, markdown
    # On a 3.5 TB volume fp8 fits where bf16 does not.
    markdown, data = plan.render([ds], KIMI, config, throughput, 3.5e12, "plan.free_tb")
    assert not data["fits"] and "it needs 3.05 TB (2.77 TiB): **it fits.**" in markdown
    config["hidden_states"]["storage"] = "fp8"
    markdown, data = plan.render([ds], KIMI, config, throughput, 3.5e12, "plan.free_tb")
    assert data["fits"] and data["needed_bytes"] == data["fp8_bytes"] and "(shards, fp8)" in markdown


def test_a_budget_and_measured_answers_refine_the_estimate(tmp_path):
    config = kimi_config(tmp_path)
    entry = {**config["datasets"]["regenerated"], "token_budget": 1_000_000}
    journal = tmp_path / "journal"
    journal.mkdir()
    (journal / "regenerated-0123456789ab.jsonl").write_text("".join(
        json.dumps({"id": f"p{i}", "status": "ok", "usage": {"completion_tokens": 1000}}) + "\n" for i in range(10)))
    ds = plan.plan_dataset("regenerated", entry, [Prompt(f"p{i}", ["x"]) for i in range(5000)], 100, 0.5, journal,
                           10240)
    assert ds.completion_per_sample == 1000 and ds.samples == 1000  # the budget stops at 1M tokens
    assert ds.prior_completion_tokens == pytest.approx(1_000_000)  # from the config alone: 244 x 4096
    assert "measured over 10 answers" in ds.completion_source


def test_online_mode_needs_no_disk(tmp_path):
    config = kimi_config(tmp_path)
    config["hidden_states"]["mode"] = "online"
    ds = plan.plan_dataset("r", config["datasets"]["regenerated"], [Prompt("a", ["x"])] * 25_000, 150, 0.5,
                           tmp_path, 10240)
    _, data = plan.render([ds], KIMI, config, plan.measured_throughput(tmp_path, {}), 2.9e12, "x")
    assert data["needed_bytes"] == 0 and data["fits"]


@pytest.mark.parametrize("n, text", [(0, "0 B"), (5000, "4.9 KiB"), (3 * 2**20, "3.0 MiB"), (5 * 2**30, "5.0 GiB"),
                                     (6.09e12, "6.09 TB (5.54 TiB)")])
def test_one_way_to_print_a_size(n, text):
    assert human_bytes(n) == text


def test_each_family_is_planned_with_its_own_epochs_and_pace(tmp_path):
    config = kimi_config(tmp_path)
    config["train"].update(families=["eagle3", "dflash"], dflash={**config["train"]["dflash"], "epochs": 10})
    config["plan"]["throughput"]["training_tok_s"] = None
    results = tmp_path / "results"
    for family, seconds in (("eagle3", 100.0), ("dflash", 400.0)):  # an earlier run of each
        (results / "train" / family).mkdir(parents=True)
        (results / "train" / family / "training.json").write_text(json.dumps({"trained_tokens": 3_000_000}))
        (results / "timings").mkdir(exist_ok=True)
        (results / "timings" / f"train_{family}.tsv").write_text(f"s\th:m:s\n{seconds}\t0:00:00\n")
    throughput = plan.measured_throughput(results, config["plan"]["throughput"], ["eagle3", "dflash"])
    assert throughput.training_tok_s == {"eagle3": 30_000, "dflash": 7_500}
    ds = plan.plan_dataset("regenerated", config["datasets"]["regenerated"], [Prompt(f"p{i}", ["x"]) for i in
                                                                              range(25_000)], 150, 0.5, tmp_path, 10240)
    markdown, _ = plan.render([ds], KIMI, config, throughput, 2.9e12, "plan.free_tb")
    assert "Validation holds out 2,500 of the ~25,000 answers' prompts (merge.validation_fraction 0.1" in markdown
    assert "| train eagle3 | 530,750,000 sequence tokens x epochs | 30,000 tok/s (measured (earlier run)) | 4.9 h |" \
        in markdown
    assert "| train dflash | 1,061,500,000 sequence tokens x epochs | 7,500 tok/s (measured (earlier run)) | 39.3 h |" \
        in markdown
    # On the serving GPUs: EAGLE-3's one layer against DFlash's five at Kimi's width.
    lines = plan.drafters_section(dataclasses.replace(KIMI, intermediate_size=18432), config, results)
    eagle3, dflash = (next(line for line in lines if line.startswith(f"| {f} |")) for f in ("eagle3", "dflash"))
    assert eagle3.startswith("| eagle3 | 1 | 969 M | 1.8 GiB |")
    assert dflash.startswith("| dflash | 5 | 3,222 M | 6.0 GiB |")


def test_the_grid_is_estimated_before_work_and_named_when_it_outgrows_the_training(tmp_path):
    """On GPUs the target alone is started once for the grid, each draft length once per method; on a 1T
    target a start is most of an hour, and at concurrency 1 a server decodes far fewer tokens a second than
    generation's batches do: a generous grid can outlast the training it measures. Each set is sent as at
    least two rounds of its concurrency (MT-bench's 80 prompts as 128 requests at 64)."""
    config = kimi_config(tmp_path)
    config["train"]["families"] = ["eagle3", "dflash"]
    config["evaluation"].update(concurrency=[1, 16, 64], num_speculative_tokens=[1, 3, 5], training_free=["ngram"],
                                temperatures=[0.0, 1.0], max_tokens=1024)
    config["plan"]["server_start_s"] = 2400
    throughput = plan.measured_throughput(tmp_path / "results", config["plan"]["throughput"])
    grid = plan.grid_plan(config, {"mt_bench": (80, 80)}, tmp_path / "results", throughput)
    assert grid.cells == (3 + 1 + 3) * 3 and grid.servers == (3 + 1 + 3) + 1  # one target alone for the grid
    # generation's 6,000 tok/s at concurrency 200, scaled to the grid's concurrencies
    assert grid.rates == {1: 30.0, 16: 480.0, 64: 1920.0}
    per_point = 8 * 2 * 80 * 1024 * 0.5
    assert grid.tokens == {1: per_point + 8 * 512, 16: per_point, 64: per_point * 128 / 80}
    assert grid.seconds == pytest.approx(8 * 2400 + (per_point + 4096) / 30 + per_point / 480
                                         + per_point * 1.6 / 1920)
    text = "\n".join(plan.grid_section(grid, training_s=3 * 3600))
    assert "21 cells (method x draft tokens x concurrency), 8 server starts (2400 s each (plan.server_start_s))" \
        in text
    assert "Each draft length of evaluation.num_speculative_tokens costs 2 server starts (~1.3 h" in text
    # ranked by tokens per step (every CPU's ranking) the largest length always wins: no advice to measure only it
    assert "needs only the largest" not in text and "picks the largest but for the runs' noise" in text
    on_cpu = plan.grid_plan({**config, "server": {**config["server"], "gpus": 0}}, {"mt_bench": (80, 80)},
                            tmp_path / "results", throughput)
    assert on_cpu.servers == (3 + 1 + 3) + 3  # a shared CPU: the target alone in each method's window
    assert "**The evaluation grid would take longer than the training (3.0 h)**" in text
    assert "longer than the training" not in "\n".join(plan.grid_section(grid, training_s=100 * 3600))
    # An earlier run's evaluations measure both the pace at each concurrency and the start-up.
    (tmp_path / "results" / "evaluation").mkdir(parents=True)
    slow, fast = {"output_tokens": 500, "wall_s": 50.0}, {"output_tokens": 500, "wall_s": 5.0}
    (tmp_path / "results" / "evaluation" / "ngram.json").write_text(json.dumps({
        "baseline": [{"concurrency": 1, "runs": [slow]}, {"concurrency": 16, "runs": [fast]}],
        "cells": [{"concurrency": 16, "runs": [fast, fast]}], "server_start_s": [30.0, 50.0]}))
    measured = plan.grid_plan(config, {"mt_bench": (80, 80)}, tmp_path / "results", throughput)
    assert measured.rates[1] == 10.0 and measured.rates[16] == 100.0 and measured.start_s == 40.0
    assert measured.rates[64] == 1920.0 and "measured" in measured.rate_source  # not measured there: scaled


def test_the_plan_says_what_the_engine_check_asks_and_what_it_found(tmp_path):
    config = kimi_config(tmp_path)
    text = "\n".join(plan.engine_check_section(config, tmp_path / "results"))
    assert "weightless twin of the target" in text and "(eagle3)" in text
    (tmp_path / "results" / "checks").mkdir(parents=True)
    (tmp_path / "results" / "checks" / "engine.gpu.json").write_text(json.dumps({"eagle3": {
        "served": False, "seconds": 72.1, "error": "ValueError: No common block size for 16"}}))
    assert "| eagle3 | NO | 72 | ValueError: No common block size for 16 |" in "\n".join(
        plan.engine_check_section(config, tmp_path / "results"))
    config["server"]["engine_check"] = False
    assert "Off (`server.engine_check: false`)" in "\n".join(plan.engine_check_section(config, tmp_path / "results"))


def test_a_trajectory_set_is_planned_a_row_per_turn_each_with_its_own_prefix(tmp_path, tokenizer):
    """Issue 58: each turn of a trajectory is a row holding the trajectory's conversation up to it. The plan
    counted the first turn's prompt once per trajectory: a 3-turn set's prompts, rows and bytes a third or less."""
    from draftsmith.data.chat import Renderer

    renderer = Renderer(tokenizer)
    chat = Prompt("c", ["first question", "second"])
    trajectory = Prompt("t", ["issue text", "observation one", "observation two"], "sys",
                        history=["action one", "action two"])
    first = len(renderer.ids(renderer.text([{"role": "user", "content": "first question"}], True)))
    assert plan.row_prompts(renderer, [chat], 10) == (first, 1.0)  # a chat set's as before
    spoken = [{"role": ["user", "assistant"][k % 2], "content": c} for k, c in enumerate(
        ["issue text", "action one", "observation one", "action two", "observation two"])]
    contexts = [[{"role": "system", "content": "sys"}, *spoken[:n]] for n in (1, 3, 5)]  # the dataset's, to each turn
    prefixes = [len(renderer.ids(renderer.text(messages, True))) for messages in contexts]
    assert plan.row_prompts(renderer, [trajectory], 10) == (pytest.approx(sum(prefixes) / 3), 3.0)
    # generation ends a trajectory at its first turn whose prefix leaves no answer token within max_length: the
    # plan counted every turn, a 40-trajectory SWE-agent set at 13.4 rows each where 1.8 were sent (benchmarks)
    assert plan.row_prompts(renderer, [trajectory], 10, max_length=prefixes[2]) == (
        pytest.approx(sum(prefixes[:2]) / 2), 2.0)
    assert plan.row_prompts(renderer, [chat], 10, max_length=2) == (first, 1.0)  # a chat row is cut, not dropped
    config = kimi_config(tmp_path)
    entry = {**config["datasets"]["regenerated"], "token_budget": 3_000_000, "max_samples": None}
    ds = plan.plan_dataset("agent", entry, [trajectory] * 5000, 2000, 0.5, tmp_path / "none", 10240, rows_per_sample=3)
    assert ds.completion_per_sample == 3 * 4096 and ds.samples == pytest.approx(3_000_000 / (3 * 4096))
    assert ds.rows == pytest.approx(3 * ds.samples)
    assert ds.sequence_tokens == pytest.approx(ds.rows * (2000 + 4096))
    markdown, data = plan.render([ds], KIMI, config, plan.measured_throughput(tmp_path, {}), 2.9e12, "x")
    assert data["rows"] == pytest.approx(ds.rows)
    assert "agent: trajectories of 3.0 turns, each turn a row holding its own prefix of ~2,000 prompt tokens: " \
           "0.5 prompt tokens per supervised token." in markdown


def test_an_openhands_trajectory_is_planned_as_generation_sends_it(tokenizer):
    """Issue 58: where the template renders calls, an OpenHands turn's prefix is its calls as structure with the
    tools (no functions' description in the system prompt); under tool_rendering: text, the export's own text."""
    from draftsmith.data.chat import Renderer, prepare_messages
    from draftsmith.generation.generate import history_messages

    renderer = Renderer(tokenizer)
    bash = {"type": "function", "function": {"name": "bash", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
    described = "sys\nYou have access to the following functions:\n" + "bash runs a command. " * 50
    trajectory = Prompt("o", ["task", "EXECUTION RESULT of [bash]:\nfile.py"], described, [bash],
                        history=["<function=bash>\n<parameter=command>ls</parameter>\n</function>"], calls="openhands")
    with_tools = renderer.with_tools([bash])
    structured = [len(with_tools.ids(with_tools.text(prepare_messages(history_messages(trajectory, k), "template"),
                                                     True))) for k in range(2)]
    as_text = [len(renderer.ids(renderer.text(history_messages(trajectory, k, "text"), True))) for k in range(2)]
    assert plan.row_prompts(renderer, [trajectory], 10) == (pytest.approx(sum(structured) / 2), 2.0)
    assert plan.row_prompts(renderer, [trajectory], 10, "text") == (pytest.approx(sum(as_text) / 2), 2.0)
    assert sum(as_text) > sum(structured)  # the description of 50 sentences is the text prefix's alone
