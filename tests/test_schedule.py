"""The published method's schedule: a draft length per batch-size band, none where plain serving wins, as the
one vLLM config for mixed traffic; checked with vLLM's own validator and the lookup its scheduler runs on."""

import pytest

from draftsmith.evaluation.decide import pick, schedule
from tests import grid
from tests.test_report import NGRAM

# EAGLE-3 pays at low load and costs at high load (as vLLM's own guide says speculation does): plain serving wins
# at 64. k=3 is best at 1, k=1 at 16.
EAGLE3 = grid.evaluation("eagle3", {(1, 1): (1.6, 1.5), (3, 1): (2.1, 2.2), (1, 16): (1.3, 1.5), (3, 16): (1.2, 2.2),
                                    (1, 64): (0.9, 1.5), (3, 64): (0.7, 2.2)})


def test_a_schedule_drafts_what_won_each_band_and_nothing_where_plain_serving_won():
    serving = pick.serving({"eagle3": EAGLE3}, [1, 16, 64], "speedup")
    plan = schedule.build(serving, "eagle3")
    assert plan["kind"] == "dynamic" and plan["k_at"] == {"1": 3, "16": 1, "64": 0}
    assert plan["ranges"] == [[1, 15, 3], [16, 63, 1], [64, 1024, 0]]
    assert schedule.describe(plan) == ("batch 1-15: k=3; batch 16-63: k=1; batch 64: no speculation; batch 65+: no "
                                       "speculation, unmeasured (the largest concurrency measured was 64)")
    assert plan["unmeasured_above"] == {"from": 65, "k": 0} and plan["starts_from"]["16"] == "engine"
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
    from draftsmith.evaluation.render.model_card import schedule as card_schedule
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
    assert ("- batch 1-15: k=3\n- batch 16-63: k=1\n- batch 64: no speculation\n"
            "- batch 65+: no speculation, unmeasured") in text
    assert ('vllm serve b/m --speculative-config \'{"method": "eagle3", "model": ".", '
            '"num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": [[1, 15, 3], [16, 63, 1], '
            '[64, 1024, 0]]}\'') in text
    assert "| 64 | 0.98× | 1.000 | plain serving (no speculation) k=0 | 1.00× | 1.000 |" in text
    assert "| 16 | 1.25× | 1.600 | EAGLE-3 k=1 | 1.30× | 1.500 |" in text


def test_a_schedule_vllm_could_not_serve_is_not_recommended():
    from draftsmith.evaluation.render.model_card import schedule as card_schedule
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


def engine_running(evaluation: dict, running: dict[int, float]) -> dict:
    """``evaluation`` with its cells' and its baseline's engine means set per concurrency."""
    for point in (*evaluation["cells"], *evaluation["baseline"]):
        for run in point["runs"]:
            run["mean_running"] = running[point["concurrency"]]
    return evaluation


def test_bands_start_where_the_engine_ran_and_vllm_drafts_what_was_measured_there():
    """Measured at [1, 12, 64], the bands were 1-11, 12-63, 64+: at concurrency 12 the engine ran 7.9 requests on
    average, so vLLM's lookup drafted the k measured at 1 at batch sizes 8-11 that concurrency 12 served, and
    k=1 at 63 running requests in the band labelled "no speculation at 64"."""
    eagle3 = engine_running(grid.evaluation("eagle3", {(3, 1): (2.1, 2.2), (1, 12): (1.3, 1.5), (3, 12): (1.2, 2.2),
                                                       (1, 64): (0.9, 1.5), (3, 64): (0.7, 2.2)}),
                            {1: 1.0, 12: 7.9, 64: 41.6})
    plan = schedule.build(pick.serving({"eagle3": eagle3}, [1, 12, 64], "speedup"), "eagle3")
    assert plan["starts"] == {"1": 1, "12": 8, "64": 42} and plan["ranges"] == [[1, 7, 3], [8, 41, 1], [42, 1024, 0]]
    dynamic = pytest.importorskip("vllm.v1.spec_decode.dynamic.utils")
    dynamic.validate_and_normalize_dynamic_sd_schedule(plan["ranges"])
    lookup = dynamic.build_dynamic_sd_schedule_lookup(plan["ranges"], 256, 3)
    assert lookup[7] == 3 and lookup[8] == lookup[41] == 1 and lookup[42] == 0
    # edges strictly increase from 1; the concurrency itself where the engine was not read, and said so
    assert schedule.band_starts([1, 2, 3, 16], {2: 1.2, 3: 1.4, 16: None}) == [1, 2, 3, 16]
    unread = schedule.build(pick.serving({"eagle3": engine_running(eagle3, {1: None, 12: None, 64: None})},
                                         [1, 12, 64], "speedup"), "eagle3")
    assert unread["starts"] == {"1": 1, "12": 12, "64": 64} and unread["starts_from"]["12"] == "concurrency"
    # the card's bands follow the same edges, and name the batch sizes above the largest measured
    assert [schedule.band_text(b) for b in schedule.bands(plan, [1, 12, 64])] == [
                                        "batch sizes 1 to 7 (measured at concurrency 1)",
                                        "batch sizes 8 to 41 (measured at concurrency 12, where the engine ran 7.9 "
                                        "on average)",
                                        "batch sizes 42 to 64 (measured at concurrency 64, where the engine ran 41.6 "
                                        "on average); above 64 unmeasured, served at its setting"]
    from draftsmith.evaluation.render.model_card import card
    from tests.test_report import card_inputs

    results = pick.results({"eagle3": eagle3}, [pick.summary("eagle3", eagle3, grid.training(), 1, "speedup", 1)],
                           "eagle3", "why", [1, 12, 64], "speedup", 1, {})
    text = card(card_inputs({**results, "schedule": plan}))
    assert "### Batch sizes 8 to 41 (measured at concurrency 12, where the engine ran 7.9 on average)" in text


def test_a_band_that_did_not_hold_is_named_and_never_presented_as_plain_serving_having_won():
    """EAGLE-3 held 5.36 in flight of 6 at concurrency 6 and the band became "no speculation", served and
    recommended as if the target alone had won there."""
    eagle3 = grid.evaluation("eagle3", {(3, 1): (2.1, 2.2), (3, 6): (0.9, 2.2)})
    for run in eagle3["cells"][1]["runs"]:
        run.update(held=False, held_why="5.36 requests in flight on average, of 6")
    serving = pick.serving({"eagle3": eagle3}, [1, 6], "speedup")
    assert serving[1]["nothing_held"] and not serving[1]["plain_wins"]
    assert serving[1]["not_held"] == [{"method": "eagle3", "k": 3, "why": "5.36 requests in flight on average, of 6"}]
    plan = schedule.build(serving, "eagle3")
    assert plan["not_held"] == {"6": "5.36 requests in flight on average, of 6"}
    assert schedule.describe(plan).endswith("concurrency 6 did not hold (5.36 requests in flight on average, of 6): "
                                            "its band is unmeasured, served as it was measured")


def test_the_one_config_names_a_training_free_method_that_beat_the_drafter_everywhere_and_sglang_gives_none():
    """The card's one config for every batch size named the published drafter though n-gram beat it at every band;
    with `engine: sglang` it gave a vLLM schedule built from SGLang cells that no server ever ran."""
    from draftsmith.evaluation.render.model_card import schedule as card_schedule
    from tests.test_report import card_inputs

    eagle3 = grid.evaluation("eagle3", {(3, 1): (1.1, 1.5), (3, 16): (0.9, 1.5)})
    ngram = grid.evaluation("ngram", {(1, 1): (1.2, 1.2), (3, 1): (1.1, 1.3), (1, 16): (1.0, 1.2), (3, 16): (0.8, 1.1)},
                            trained=False)
    evaluations = {"eagle3": eagle3, "ngram": ngram}
    results = {**pick.results(evaluations, [pick.summary("eagle3", eagle3, grid.training(), 1, "speedup", 1)],
                              "eagle3", "why", [1, 16], "speedup", 1, NGRAM), "on_accelerator": True}
    assert schedule.best_single(results["serving"], "eagle3") == {"method": "ngram", "k": 1}
    plan = schedule.build(results["serving"], "eagle3")
    served = {"schedule": plan, "speculative_config": schedule.speculative_config(plan, ".", {}), "measured": {}}
    text = "\n".join(card_schedule(card_inputs(results, serving=served)))
    assert text.index("n-gram with 1 draft token, which needs no drafter, beat EAGLE-3 at every measured "
                      "concurrency: it is the best single config for every batch size") < \
        text.index('"method": "ngram", "num_speculative_tokens": 1, "prompt_lookup_min": 2') < \
        text.index("This drafter's own config for every batch size, if you serve it:")
    # beaten at one band only: the drafter's own schedule is the one config
    assert schedule.best_single(pick.serving({"eagle3": EAGLE3, "ngram": ngram}, [1, 16, 64], "speedup"),
                                "eagle3") is None
    on_sglang = "\n".join(card_schedule(card_inputs({**results, "engine": "sglang"}, serving=served)))
    assert "vLLM's only" in on_sglang and "measured with sglang: no schedule is given" in on_sglang
    assert "vllm serve" not in on_sglang


def test_a_cpus_config_says_its_draft_length_is_the_largest_not_a_gpus_best():
    from draftsmith.evaluation.render.model_card import card
    from draftsmith.evaluation.render.model_card import schedule as card_schedule
    from tests.test_report import card_inputs

    results = pick.results({"eagle3": EAGLE3}, [pick.summary("eagle3", EAGLE3, grid.training(), 1, "tau", 1)],
                           "eagle3", "why", [1, 16, 64], "tau", 1, {})
    plan = schedule.build(results["serving"], "eagle3")
    served = {"schedule": plan, "speculative_config": schedule.speculative_config(plan, ".", {}), "measured": {}}
    text = "\n".join(card_schedule(card_inputs(results, serving=served)))
    assert "a draft length measured there is not a GPU's best" in text
    assert "Batch sizes from 65 up are unmeasured (the largest concurrency measured was 64)" in text  # fixed k=3
    assert "not a GPU's best" not in "\n".join(card_schedule(card_inputs({**results, "on_accelerator": True},
                                                                         serving=served)))
    whole = card(card_inputs(results, serving=served))
    assert "carries over" not in whole
    assert "On a CPU tokens per step rise with the draft length but for the runs' noise" in whole


def test_a_band_served_plain_starts_where_the_target_alones_engine_ran_not_the_drafters():
    """Where plain serving won (k 0), the schedule serves the target alone there, so its band starts at the
    target alone's running count: a drafter its KV cache held back (6.0 of 16) would start the band at 6."""
    serving = [{"concurrency": 1, "ranked": [{"method": "eagle3", "mean_running": 1.0},
                                             {"method": "plain", "mean_running": 1.0}]},
               {"concurrency": 16, "ranked": [{"method": "plain", "mean_running": 15.2},
                                              {"method": "eagle3", "mean_running": 6.0}]}]
    assert schedule.served_running(serving, "eagle3", {1: 3, 16: 0}) == {1: 1.0, 16: 15.2}
    assert schedule.band_starts([1, 16], schedule.served_running(serving, "eagle3", {1: 3, 16: 0})) == [1, 15]
