"""The published method's schedule: a draft length per batch-size band, none where plain serving wins, as the
one vLLM config for mixed traffic; checked with vLLM's own validator and the lookup its scheduler runs on."""

import pytest

from draftsmith.evaluation import pick, schedule
from tests import grid

# EAGLE-3 pays at low load and costs at high load (as vLLM's own guide says speculation does): plain serving wins
# at 64. k=3 is best at 1, k=1 at 16.
EAGLE3 = grid.evaluation("eagle3", {(1, 1): (1.6, 1.5), (3, 1): (2.1, 2.2), (1, 16): (1.3, 1.5), (3, 16): (1.2, 2.2),
                                    (1, 64): (0.9, 1.5), (3, 64): (0.7, 2.2)})


def test_a_schedule_drafts_what_won_each_band_and_nothing_where_plain_serving_won():
    serving = pick.serving({"eagle3": EAGLE3}, [1, 16, 64], "speedup")
    plan = schedule.build(serving, "eagle3")
    assert plan["kind"] == "dynamic" and plan["k_at"] == {"1": 3, "16": 1, "64": 0}
    assert plan["ranges"] == [[1, 15, 3], [16, 63, 1], [64, 1024, 0]]
    assert schedule.describe(plan) == "batch 1-15: k=3; batch 16-63: k=1; batch 64+: no speculation"
    config = schedule.speculative_config(plan, "results/drafter", {})
    assert config == {"method": "eagle3", "model": "results/drafter", "num_speculative_tokens": 3,
                      "num_speculative_tokens_per_batch_size": [[1, 15, 3], [16, 63, 1], [64, 1024, 0]]}
    # What vLLM 0.32 does with it: valid, and its scheduler's lookup drafts 3 up to 15 requests, 1 to 63, none after.
    dynamic = pytest.importorskip("vllm.v1.spec_decode.dynamic.utils")
    dynamic.validate_and_normalize_dynamic_sd_schedule(config["num_speculative_tokens_per_batch_size"])
    lookup = dynamic.build_dynamic_sd_schedule_lookup(config["num_speculative_tokens_per_batch_size"], 256, 3)
    assert lookup[1] == lookup[15] == 3 and lookup[16] == lookup[63] == 1 and lookup[64] == lookup[256] == 0


def test_one_draft_length_everywhere_is_the_fixed_setting_and_plain_everywhere_is_no_speculation():
    fixed = schedule.build(pick.serving({"eagle3": EAGLE3}, [1, 16, 64], "tau"), "eagle3")  # by tokens per step
    assert fixed["kind"] == "fixed" and fixed["ranges"] == [[1, 1024, 3]]
    assert "num_speculative_tokens_per_batch_size" not in schedule.speculative_config(fixed, ".", {})
    slow = grid.evaluation("eagle3", {(3, 1): (0.8, 2.0), (3, 16): (0.6, 2.0)})
    plain = schedule.build(pick.serving({"eagle3": slow}, [1, 16], "speedup"), "eagle3")
    assert plain["kind"] == "plain" and schedule.speculative_config(plain, ".", {}) is None
    # neighbours with the same k merge; a band where the family has no figure drafts nothing
    failed = grid.evaluation("eagle3", {(3, 1): (1.5, 2.0), (3, 4): (1.4, 2.0)})
    failed["cells"] = [c for c in failed["cells"] if c["concurrency"] == 1]
    partial = schedule.build(pick.serving({"eagle3": failed}, [1, 4, 8], "speedup"), "eagle3")
    assert partial["ranges"] == [[1, 3, 3], [4, 1024, 0]] and partial["unmeasured"] == [4, 8]
    assert schedule.describe(partial).endswith("eagle3 has no figure at concurrency 4, 8: served there without "
                                               "speculation, unmeasured")


def test_the_card_carries_the_schedule_as_one_command_and_what_it_measured_served_as_one():
    from draftsmith.evaluation.model_card import schedule as card_schedule
    from tests.test_report import card_inputs

    results = {**pick.results({"eagle3": EAGLE3}, [pick.summary("eagle3", EAGLE3, grid.training(), 1, "speedup", 1)],
                              "eagle3", "why", [1, 16, 64], "speedup", 1, {}), "on_accelerator": True}
    plan = schedule.build(results["serving"], "eagle3")
    measured = grid.evaluation("eagle3", {(3, 1): (2.0, 2.1), (3, 16): (1.25, 1.6), (3, 64): (0.98, 1.0)})
    for cell in measured["cells"]:
        cell["drafter"] = "schedule"
    served = {"schedule": plan, "speculative_config": schedule.speculative_config(plan, ".", {}),
              "measured": {"cells": measured["cells"]}}
    text = "\n".join(card_schedule(card_inputs(results, serving=served)))
    assert "batch 1-15: k=3; batch 16-63: k=1; batch 64+: no speculation" in text
    assert ('vllm serve b/m --speculative-config \'{"method": "eagle3", "model": "<this folder>", '
            '"num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": [[1, 15, 3], [16, 63, 1], '
            '[64, 1024, 0]]}\'') in text
    assert "| 64 | 0.98× | 1.000 | plain serving (no speculation) k=0 | 1.00× | 1.000 |" in text
    assert "| 16 | 1.25× | 1.600 | EAGLE-3 k=1 | 1.30× | 1.500 |" in text


def test_a_schedule_vllm_could_not_serve_is_not_recommended():
    from draftsmith.evaluation.model_card import schedule as card_schedule
    from tests.test_report import card_inputs

    results = {**pick.results({"eagle3": EAGLE3}, [pick.summary("eagle3", EAGLE3, grid.training(), 1, "speedup", 1)],
                              "eagle3", "why", [1, 16, 64], "speedup", 1, {}), "on_accelerator": True}
    plan = schedule.build(results["serving"], "eagle3")
    served = {"schedule": plan, "speculative_config": schedule.speculative_config(plan, ".", {}),
              "measured": {"cells": [{"drafter": "schedule", "k": 3, "concurrency": c, "runs": [],
                                      "failed": "ServerExited: server exited with code 1 before it was ready"}
                                     for c in (1, 16, 64)]}}
    text = "\n".join(card_schedule(card_inputs(results, serving=served)))
    assert "**vLLM could not serve it here** (ServerExited" in text and "vllm serve" not in text
