"""Drafter families: each family's settings and trainer arguments, its mask token, and the pick."""

from types import SimpleNamespace

import pytest

from draftsmith.config.load import ConfigError, result_view, validate_config
from draftsmith.evaluation.decide import pick
from draftsmith.training import families
from draftsmith.training import train as tr
from tests import grid
from tests.test_config import MINIMAL


def train_view(**train):
    return result_view(validate_config({**MINIMAL, "train": train}))["train"]


def test_a_family_has_its_own_settings_and_eagle3_keeps_its_key():
    train = train_view(families=["eagle3", "dflash"], dflash={"block_size": 8, "num_layers": 1, "epochs": 5},
                       epochs=2, ttt_steps=5)
    eagle3, dflash = families.settings(train, "eagle3"), families.settings(train, "dflash")
    # EAGLE-3's settings are train's keys as before families existed: its run key and params do not change.
    assert eagle3 == families.settings(train_view(epochs=2, ttt_steps=5), "eagle3")
    assert "families" not in eagle3 and "dflash" not in eagle3
    assert (dflash["family"], dflash["block_size"], dflash["num_layers"], dflash["epochs"], dflash["lr"]) == \
        ("dflash", 8, 1, 5, train["lr"])  # the block's own value over the shared one; null takes the shared
    assert "ttt_steps" not in dflash and "architecture" not in dflash
    # Adding a family or changing its block changes nothing of another's.
    assert families.settings(train_view(families=["eagle3", "dspark"], epochs=2, ttt_steps=5,
                                        dflash={"block_size": 4}), "eagle3") == eagle3


def test_the_config_offers_the_families_draftsmith_knows():
    from draftsmith.config.load import SCHEMA

    offered = SCHEMA["properties"]["train"]["properties"]["families"]["items"]["enum"]
    assert offered == list(families.VLLM_METHOD) == list(families.DISPLAY_NAME)
    assert set(offered) - {families.DEFAULT_FAMILY} == set(families.BLOCK_FAMILIES)


@pytest.mark.parametrize("bad", [{"families": []}, {"families": ["eagle3", "eagle3"]}, {"families": ["medusa"]},
                                 {"dflash": {"block_size": 1}}, {"dflash": {"ttt_steps": 3}}])
def test_bad_family_settings_fail_validation(bad):
    with pytest.raises(ConfigError):
        validate_config({**MINIMAL, "train": bad})


def resolve(argv):
    from speculators.train.config import TrainConfig

    import draftsmith.hidden_states.store  # noqa: F401 - registers the backend

    return TrainConfig.resolve([a for a in argv if a not in tr.OWN_FLAGS]).flatten()


@pytest.mark.parametrize("family", ["dflash", "dspark"])
def test_a_block_family_trains_with_its_own_arguments(tmp_path, family):
    cfg = families.settings(train_view(families=[family], **{family: {"block_size": 8, "num_layers": 2}}), family)
    kw = {"verifier": "results/models/t", "data_dir": tmp_path, "save_dir": tmp_path, "d2t": tmp_path / "d2t.npy",
          "t2d": tmp_path / "t2d.npy", "aux_layers": [2, 15, 27], "train_ratio": 0.9, "device": "cpu",
          "log_dir": tmp_path, "num_workers": 1}
    with pytest.raises(ValueError, match="mask token"):
        tr.speculators_args(cfg, **kw)
    argv = tr.speculators_args(cfg, mask_token_id=7, **kw)
    assert not {"--ttt-steps", "--draft-arch", "--no-norm-output", "--loss-fn"} & set(argv)
    flat = resolve(argv)  # speculators' own parser takes them
    assert (flat["speculator_type"], flat["block_size"], flat["num_layers"], flat["mask_token_id"]) == \
        (family, 8, 2, 7)
    assert flat["draft_attn_impl"] == "sdpa" and flat["sliding_window_non_causal"] is False
    # Left unset, speculators' recipe applies.
    default = resolve(tr.speculators_args(families.settings(train_view(families=[family]), family),
                                          mask_token_id=7, **kw))
    assert default["num_layers"] == 5 and default["block_size"] == families.SPECULATORS_BLOCK_SIZE[family]


class Tokenizer(SimpleNamespace):
    def __len__(self):
        return self.size

    def convert_ids_to_tokens(self, i):
        return f"<special {i}>"


def test_the_mask_token_is_never_a_token_the_data_contains():
    smollm = Tokenizer(size=100, mask_token_id=None, mask_token=None, all_special_ids=[0, 1, 2],
                       added_tokens_decoder={0: 0, 1: 1, 2: 2, 3: 3, 4: 4})
    def used():  # end-of-turn (2) and pad are on every row
        return {0, 1, 2, 10, 11}

    assert tr.choose_mask_token(None, smollm, 100, used)[0] == 4
    assert tr.choose_mask_token(None, smollm, 128, used)[0] == 100  # a spare embedding row past the tokenizer
    assert tr.choose_mask_token(42, smollm, 100, used) == (42, "configured")
    with_mask = Tokenizer(**{**vars(smollm), "mask_token_id": 3, "mask_token": "<mask>"})
    assert tr.choose_mask_token(None, with_mask, 100, used)[0] == 3
    with pytest.raises(ValueError, match="mask_token_id"):
        tr.choose_mask_token(None, smollm, 100, lambda: used() | {3, 4})


def test_the_data_tokens_are_read_in_batches_of_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [[1, 2, 3], [3, 4], [99]] * 50
    pq.write_table(pa.table({"input_ids": rows}), tmp_path / "m.parquet", row_group_size=7)
    assert tr.token_ids(tmp_path / "m.parquet") == {1, 2, 3, 4, 99}


def test_a_block_family_is_scored_by_its_own_acceptance_length():
    assert tr.simulated_tau({"eal_epoch": 2.5, "full_acc_0_epoch": 0.9}) == 2.5
    assert tr.simulated_tau({"full_acc_0_epoch": 0.5, "full_acc_1_epoch": 0.25}) == 1.75
    # Block families also log full_acc (all positions pooled), which is no step of a chain.
    dspark = {"full_acc_epoch": 0.1, "position_2_acc_epoch": 0.2, "position_1_acc_epoch": 0.4, "eal_epoch": 1.3}
    assert families.step_accuracies(dspark) == [("position_1_acc_epoch", "position_1_acc"),
                                                ("position_2_acc_epoch", "position_2_acc")]
    assert families.first_position_accuracy(dspark) == 0.4
    assert families.first_position_accuracy({"full_acc_epoch": 0.1, "full_acc_0_epoch": 0.3}) == 0.3
    assert families.num_speculative_tokens("dflash", {"block_size": 8}, 3) == 7
    assert families.num_speculative_tokens("dspark", {"block_size": 8, "sample_from_anchor": True}, 3) == 8
    assert families.num_speculative_tokens("eagle3", {}, 3) == 3


def rows(by, at, **evaluations):
    return [pick.summary(f, e, grid.training(), 1000, by, at) for f, e in evaluations.items()]


def test_the_pick_takes_the_best_measured_family_at_its_concurrency_and_says_by_how_much():
    # Speed-ups are ratios: 2x on one set and 0.5x on another is no gain (geometric mean), not 1.25x.
    eagle3 = grid.evaluation("eagle3", {(1, 1): (1.1, 1.4), (3, 1): (1.2, 1.5), (1, 16): (0.9, 1.4),
                                        (3, 16): (0.8, 1.5)})
    dflash = grid.evaluation("dflash", {(7, 1): (1.0, 2.5), (7, 16): (1.05, 2.5)})
    dflash["cells"][0]["runs"][0]["speedup"], dflash["cells"][0]["runs"][1]["speedup"] = 2.0, 0.5
    chosen, why = pick.choose(rows("speedup", 1, eagle3=eagle3, dflash=dflash), "speedup", 1)
    assert chosen == "eagle3" and "at concurrency 1, 3 draft tokens, +20.0% over dflash" in why, why
    # At another concurrency another family wins: the pick is made where the user serves.
    assert pick.choose(rows("speedup", 16, eagle3=eagle3, dflash=dflash), "speedup", 16)[0] == "dflash"
    assert pick.choose(rows("tau", 1, eagle3=eagle3, dflash=dflash), "tau", 1)[0] == "dflash"
    # A tie goes to the family listed first.
    assert pick.choose(rows("speedup", 1, dflash=eagle3, eagle3=eagle3), "speedup", 1)[0] == "dflash"


def test_each_concurrency_names_its_best_setting_and_a_training_free_winner_plainly():
    eagle3 = grid.evaluation("eagle3", {(1, 1): (1.1, 1.5), (3, 1): (1.4, 1.9), (1, 16): (1.02, 1.5),
                                        (3, 16): (0.9, 1.9)})
    ngram = grid.evaluation("ngram", {(1, 1): (1.05, 1.3), (3, 1): (1.0, 1.4), (1, 16): (1.1, 1.3),
                                      (3, 16): (1.04, 1.4)}, trained=False)
    low, high = pick.serving({"eagle3": eagle3, "ngram": ngram}, [1, 16], "speedup")
    assert (low["best"]["method"], low["best"]["k"], low["training_free_wins"]) == ("eagle3", 3, False)
    assert low["runner_up"]["method"] == "ngram" and low["margin"] == pytest.approx(1.4 / 1.05 - 1)
    assert low["training_bought"] == pytest.approx(1.9 / 1.3 - 1)  # tokens per target step of the best of each
    assert (high["best"]["method"], high["best"]["k"], high["training_free_wins"]) == ("ngram", 1, True)
    assert high["best_trained"]["k"] == 1 and high["best_training_free"]["k"] == 1
    only_free = pick.serving({"ngram": ngram}, [1, 16], "speedup")
    assert not any(e["training_free_wins"] for e in only_free) and only_free[1]["best_trained"] is None


def test_a_training_free_run_that_measured_nothing_fails_with_each_methods_reason():
    """Before, every server failing still wrote training_free.md ("nothing measured") and exited 0."""
    ngram = grid.evaluation("ngram", {(1, 1): (1.05, 1.3)}, trained=False)
    pick.require_measured({"ngram": ngram}, pick.serving({"ngram": ngram}, [1], "speedup"), "speedup")
    dead = {"method": "ngram", "trained": False, "cells": [{"drafter": "ngram", "k": 3, "concurrency": 1, "runs": [],
                                                            "failed": "ServerError: server exited with code 1"}]}
    suffix = {"method": "suffix", "trained": False, "not_served": "suffix decoding needs arctic-inference", "cells": []}
    evaluations = {"ngram": dead, "suffix": suffix}
    with pytest.raises(pick.NothingToPick, match=r"ngram: ServerError: server exited.*suffix: suffix decoding needs"):
        pick.require_measured(evaluations, pick.serving(evaluations, [1], "speedup"), "speedup")


def test_a_family_not_served_here_or_failed_is_left_out_with_its_reason():
    dspark = {"method": "dspark", "trained": True, "not_served": families.not_served_here("dspark", on_gpus=False),
              "cells": []}
    dflash = {"method": "dflash", "trained": True, "failed": "export gate: served first-token acceptance 0.001 is far "
                                                             "below the validation accuracy 0.300", "cells": []}
    table = rows("speedup", 4, dspark=dspark, dflash=dflash, eagle3=grid.evaluation("eagle3", {(3, 4): (0.9, 1.1)}))
    assert [(r["served"], r["excluded"], r["score"]) for r in table[:2]] == [(False, "not served here", None),
                                                                              (False, "failed", None)]
    assert "V2 model runner" in table[0]["reason"] and "export gate" in table[1]["reason"]
    chosen, why = pick.choose(table, "speedup", 4)
    assert chosen == "eagle3" and "dspark (not served here), dflash (failed)" in why
    assert families.not_served_here("dspark", on_gpus=True) is None
    # Nothing measured: nothing to pick, and the message names each family's reason.
    silent = grid.evaluation("eagle3", {(3, 4): (1.0, None)})
    with pytest.raises(pick.NothingToPick, match=r"dspark: vLLM serves DSpark.*dflash: export gate"):
        pick.choose(rows("tau", 4, dspark=dspark, dflash=dflash, eagle3=silent), "tau", 4)


def test_the_preflight_names_what_a_family_cannot_get_before_any_work(tmp_path):
    from draftsmith.config.load import load_layers
    from draftsmith.ops import preflight
    from tests.test_config import DEFAULT, problems_of

    both = {"train": {"families": ["eagle3", "dflash"]}}
    assert problems_of(both, tmp_path) == []
    found = problems_of({**both, "evaluation": {"engine": "sglang"}, "export": {"sglang": True},
                         "train": {"families": ["eagle3", "dflash"], "architecture": "eagle3"}}, tmp_path)
    assert any(p.startswith("evaluation.engine sglang evaluates EAGLE-3 drafters here; train.families has dflash")
               for p in found), found
    assert any(p.startswith("export.sglang true exports EAGLE-3's SGLang layout") for p in found), found
    # DSpark is trained and exported on CPUs but served only by vLLM's V2 model runner: said before work.
    dspark = validate_config(load_layers([DEFAULT], {"train": {"families": ["eagle3", "dspark"]}}))
    def family_notices(config):
        return [n for n in preflight.notices(config, tmp_path) if n.startswith("train.families")]

    assert family_notices(dspark) == [f"train.families: dspark: {families.not_served_here('dspark', False)}"]
    dspark["server"]["gpus"] = 8
    assert family_notices(dspark) == []
    # With no family served here, nothing could be measured and picked: refused before any work.
    found = problems_of({"train": {"families": ["dspark"]}}, tmp_path)
    assert found == ["train.families ['dspark']: none can be served here, and results/drafter/ is the family "
                     "measured best; add eagle3 or dflash, or serve on GPUs (server.gpus)"]


def test_a_family_whose_export_or_gate_failed_is_not_measured_and_says_why():
    from draftsmith.evaluation.measure import methods

    passed = {"passed": True, "served": True, "verdict": "served first-token acceptance 0.2"}
    assert methods.not_measured("eagle3", False, passed) == {}
    assert methods.not_measured("dflash", False, {"passed": False, "served": None, "verdict": "vLLM did not serve "
                                                  "the drafter"}) == {"failed": "vLLM did not serve the drafter"}
    assert methods.not_measured("dflash", False, {"passed": None, "served": False, "verdict": "mend not taken"}) == \
        {"not_served": "mend not taken"}
    assert "V2 model runner" in methods.not_measured("dspark", False, passed)["not_served"]
    assert methods.not_measured("dspark", True, passed) == {} and methods.not_measured("ngram", False, None) == {}
