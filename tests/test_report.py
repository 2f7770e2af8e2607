import pytest

from draftsmith.evaluation.decide import pick
from draftsmith.evaluation.render.report import Inputs, write_report
from tests import grid

NGRAM = {"prompt_lookup_min": 2, "prompt_lookup_max": 4}


def results_of(evaluations: dict, pick_by: str = "speedup", pick_at: int = 2) -> dict:
    """results.json as the pick job writes it, from the evaluations of every method."""
    families = [m for m, e in evaluations.items() if e.get("trained")]
    rows = [pick.summary(f, evaluations[f], grid.training(), 3 * 2**20, pick_by, pick_at) for f in families]
    chosen, why = pick.choose(rows, pick_by, pick_at)
    concurrencies = sorted({c for e in evaluations.values() for c in e.get("concurrency", [])})
    return pick.results(evaluations, rows, chosen, why, concurrencies, pick_by, pick_at, NGRAM)


EAGLE3 = grid.evaluation("eagle3", {(1, 2): (0.8, 1.2), (3, 2): (0.9, 1.3), (1, 8): (0.7, 1.2), (3, 8): (0.6, 1.3)})
NGRAM_EVALUATION = grid.evaluation("ngram", {(1, 2): (0.95, 1.1), (3, 2): (0.85, 1.15), (1, 8): (1.05, 1.1),
                                             (3, 8): (1.0, 1.15)}, trained=False)
RESULTS = results_of({"eagle3": EAGLE3, "ngram": NGRAM_EVALUATION})
GENERATION = {"everyday": {"records": 6, "errors": 0, "retries": 2, "truncated_kept": 6, "reasoning_records": 0,
                           "dropped_truncated": 0, "completion_tokens": 192, "latency_p50_s": 1.5,
                           "latency_p95_s": None}}
PROMPTS = {"everyday": {"rows_read": 9, "rejected_rows": 1, "kept": 6, "dropped": {"exact": 1, "duplicate": 1},
                        "examples": [{"id": "e-7", "reason": "exact", "matches": "everyday/bench-1", "overlap": 1.0,
                                      "prompt": "Explain gravity."}]}}
MERGE = {"datasets": {"everyday": {"weight": 1.0, "train_rows": 5, "validation_rows": 1,
                                   "train_supervised_tokens": 150}}}
VOCAB = {"source": "pretrained drafter org/drafter", "draft_vocab_size": 2048, "target_vocab_size": 49152,
         "coverage": 0.987, "d2t_sha256": "ab" * 32}
TRAINING = {"rows": 12, "run_key": "abc", "on_cpu": True, "chosen": {"epoch": 0, "reason": "best simulated τ 1.150"},
            "hidden_states": {"mode": "online", "layout": None, "aux_layers": [2, 15, 27]},
            "warm_start": {"source": "org/drafter", "layout": "eagle3"},
            "trainer": {"loss_implementation": "eager", "compile": True,
                        "reason": "torch.compile works (12 s); the fused loss failed its probe compiled: "
                                  "AssertionError: ListVariable, so eager (3 s)"},
            "phases": {"launch_s": 31.5, "build_s": 4.0, "first_step_s": 24.2, "compile_s": 18.0,
                       "first_validation_s": 21.0, "done_s": 80.0, "exit_s": 0.4, "steps_per_s": 5.0},
            "validation": [{"epoch": 0, "loss_epoch": 9.1, "full_acc_0_epoch": 0.15, "full_acc_1_epoch": 0.0,
                            "simulated_tau": 1.15, "train_s": 90.0},
                           {"epoch": 1, "loss_epoch": 7.2, "full_acc_0_epoch": 0.1, "full_acc_1_epoch": 0.01,
                            "simulated_tau": 1.11}]}
GATE = {"passed": True, "verdict": "served first-token acceptance 0.140 (validation 0.150)"}


EAGLE3_TRAIN = {"num_layers": 1, "architecture": "speculators", "epochs": 3, "lr": 0.001, "optimizer": "muon",
                "scheduler": "linear", "ttt_steps": 3, "ttt_step_loss_decay": 1.0, "total_seq_len": 1024,
                "loss_fn": "lk_hybrid", "train_lm_head": True}


def card_inputs(results: dict, **overrides):
    """The model card's inputs for an EAGLE-3 drafter published from ``results``."""
    from draftsmith.evaluation.render.model_card import CardInputs

    return CardInputs(**{"base_model": "b/m", "config_digest": "0", "datasets": {}, "results": results,
                         "training": TRAINING, "merge": MERGE, "prompts": PROMPTS, "drafter_config": {},
                         "sglang_reason": None, "train_config": EAGLE3_TRAIN, **overrides})


def band_by_band(card: str) -> str:
    """The card's serving recipe band by band, below its first screen."""
    return card.split("## Serving recipe, band by band")[1]


def report(tmp_path, inputs: Inputs) -> str:
    paths = {name: tmp_path / f"{name}.png" for name in ("acc", "train", "families", "map")}
    write_report(inputs, tmp_path / "report.md", paths["acc"], paths["train"], paths["families"], paths["map"],
                 tmp_path / "evaluation.tsv")
    assert all(path.read_bytes()[:4] == b"\x89PNG" for path in paths.values())
    return (tmp_path / "report.md").read_text()


def test_report_shows_every_stage_with_plots(tmp_path):
    text = report(tmp_path, Inputs(RESULTS, GENERATION, PROMPTS, MERGE, VOCAB, TRAINING, GATE))
    table = (tmp_path / "evaluation.tsv").read_text().splitlines()
    assert table[0].split("\t")[:6] == ["method", "draft_tokens", "concurrency", "prompt_set", "temperature", "prompts"]
    assert table[1].startswith("EAGLE-3\t1\t2\teveryday\t0.0\t3\t1.2") and len(table) == 1 + 16
    # every cell: method, draft tokens, concurrency, set, T, τ, tokens per step, by position, tok/s, speed-up
    assert ("| EAGLE-3 | 3 | 2 | 2.0 (2.0, 2) | everyday | 0 | 3 | 1.300 | 1.300 | 0.40, 0.10 | 40.0 | 36.0 | 0.90× |"
            in text)
    assert ("| n-gram | 1 | 8 | 7.9 (7.5, 8) | everyday | 1 | 3 | 1.100 | 1.100 | 0.40, 0.10 | 40.0 | 42.0 | 1.05× |"
            in text)
    # time to quality per epoch; a run recorded before train_s existed shows none
    assert "| 1 | 9.100 | 0.150 | 0.000 | 1.150 | – | – | 1.5 min | ✔ |" in text  # (trained before predictions)
    assert "| 2 | 7.200 | 0.100 | 0.010 | 1.110 | – | – | – |  |" in text
    predicted = {**TRAINING, "validation": [{**TRAINING["validation"][0], "predicted_served": {
        "tokens_per_step": 1.12, "rows": 20, "without_looping_rows": {"tokens_per_step": 1.08, "rows": 17}}}]}
    assert "| 1 | 9.100 | 0.150 | 0.000 | 1.150 | 1.120 | 1.080 (17 of 20 rows) | 1.5 min | ✔ |" in report(
        tmp_path, Inputs(RESULTS, GENERATION, PROMPTS, MERGE, VOCAB, predicted, GATE))
    assert '**Exported: epoch 1 (recorded as "epoch": 0, counted from 0)**: best simulated τ 1.150' in text
    assert "Export gate: passed" in text
    assert "Loss computed **eager**, forward compiled (torch.compile works (12 s); the fused loss failed" in text
    assert "| first step | 24.2 |" in text and "| of which compiling | 18.0 |" in text
    assert "| steady pace | 5.00 steps/s |" in text and "| processes exited after | 0.4 |" in text
    assert "Vocabulary mapping: pretrained drafter org/drafter" in text and "98.7%" in text
    assert "hidden states **online**" in text and "Warm start from `org/drafter`" in text
    assert "![acceptance and tokens per step](acc.png)" in text and "(train.png)" in text
    assert "![speed-up map](map.png)" in text
    assert "| everyday | 6 | 0 | 2 | 6 | 0 | – | 0 | 192 | 1.50 | – |" in text
    assert "| everyday | 9 | 1 | 6 | 1 | 0 | 1 | 1.0 | 5 | 1 | 150 |" in text
    assert "everyday/bench-1" in text
    assert "Measured on a CPU" in text  # results without on_accelerator: a CPU run
    on_gpus = Inputs({**RESULTS, "on_accelerator": True, "compute": None}, GENERATION, PROMPTS, MERGE, VOCAB,
                     {**TRAINING, "on_cpu": False}, GATE)
    assert "CPU" not in report(tmp_path, on_gpus)  # a GPU run's report says nothing of CPUs
    fp8 = {**TRAINING, "hidden_states": {"mode": "offline", "layout": "shards", "storage": "fp8", "aux_layers": [1]}}
    assert "(shards layout, stored in fp8 with a scale per token and layer)" in report(
        tmp_path, Inputs(RESULTS, GENERATION, PROMPTS, MERGE, VOCAB, fp8, GATE))


def test_the_serving_recipe_names_the_best_setting_per_concurrency_and_a_training_free_winner(tmp_path):
    text = report(tmp_path, Inputs(RESULTS, GENERATION, PROMPTS, MERGE, VOCAB, TRAINING, GATE))
    assert "## Serving recipe" in text
    # plain serving is a setting: at 2 every method slowed the target down
    assert ("| 2 | plain serving (no speculation) | 0 | 1.00× | 1.000 | +5.3% over n-gram k=1 | EAGLE-3 k=3: 0.90×, "
            "1.300 tok/step | n-gram k=1: 0.95×, 1.100 tok/step | +18.2% |") in text
    assert "**At concurrency 2, plain serving (no speculation) is fastest**" in text
    assert "| 8 | n-gram | 1 | 1.05× | 1.100 | +5.0% over plain serving (no speculation) k=0 |" in text
    assert "**At concurrency 8, n-gram (training-free, k=1) beats every trained drafter**" in text
    assert "At concurrency 2, n-gram" not in text


def test_the_model_card_is_what_the_hub_shows(tmp_path, monkeypatch):
    import yaml

    from draftsmith.evaluation.render.model_card import CardInputs, card

    train_config = {"num_layers": 1, "architecture": "speculators", "epochs": 3, "lr": 0.001, "optimizer": "muon",
                    "scheduler": "linear", "ttt_steps": 3, "ttt_step_loss_decay": 1.0, "total_seq_len": 1024,
                    "loss_fn": "lk_hybrid", "train_lm_head": True}
    datasets = {"everyday": {"source": "config/prompts/everyday.jsonl", "weight": 1.0,
                             "generation": {"temperature": 0.6, "top_p": 0.95, "max_tokens": 8192}},
                "ultrachat": {"source": "hf:HuggingFaceH4/ultrachat_200k@train_sft", "weight": 0.5,
                              "generation": {"temperature": 0.0, "max_tokens": 512}},
                "mine": {"source": "hf:data/mine", "weight": 1.0, "generation": {"temperature": 0.0, "max_tokens": 64}}}
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "mine").mkdir(parents=True)  # a saved dataset on this disk, read through datasets
    merge = {"datasets": {**MERGE["datasets"], "ultrachat": {**MERGE["datasets"]["everyday"], "weight": 0.5},
                          "mine": MERGE["datasets"]["everyday"]}}
    text = card(CardInputs(base_model="HuggingFaceTB/SmolLM2-135M-Instruct", config_digest="0123abcd",
                           datasets=datasets, results=RESULTS, training=TRAINING, merge=merge, prompts=PROMPTS,
                           train_config=train_config, drafter_config={},
                           sglang_reason="not exported: norm_before_residual=true"))
    meta = yaml.safe_load(text.split("---\n")[1])
    # The hub links datasets by their hub ids: a local file's name ("everyday") or folder ("data/mine") is none.
    assert meta["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert meta["datasets"] == ["HuggingFaceH4/ultrachat_200k"]
    assert "| everyday | `config/prompts/everyday.jsonl` | T=0.6, top_p 0.95, max 8192 tokens | 6 | 1 / 1 | 1 | 5 " \
        "| 1 | 150 |" in text
    assert "| ultrachat | `HuggingFaceH4/ultrachat_200k` | T=0, max 512 tokens |" in text and "| 0.5 |" in text
    assert "loss `lk_hybrid`" in text and "draft LM head trained" in text
    assert "hidden states online (never stored)" in text
    offline = {**TRAINING, "hidden_states": {"mode": "offline", "layout": "shards", "storage": "fp8",
                                             "aux_layers": [2, 15, 27]}}
    offline_card = card(CardInputs(base_model="m", config_digest="0", datasets=datasets, results=RESULTS,
                                   training=offline, merge=merge, prompts=PROMPTS, train_config=train_config,
                                   drafter_config={}, sglang_reason=None))
    assert "their hidden states stored in fp8" in offline_card
    assert "eagle3" in meta["tags"] and meta["license_name"] == "same-as-base-model"
    assert "no SGLang export was written (not exported: norm_before_residual=true)" in text
    assert "| everyday | 3 | 0 | 1.300 | 1.300 | 0.40, 0.10 |" in text and "| everyday | 3 | 1 | 1.300 |" in text
    assert "Config digest: `0123abcd`" in text and "Exported epoch 1 (recorded as \"epoch\": 0, counted from 0)" in text
    assert "Loss computed **eager**, forward compiled: torch.compile works" in text  # and why


DSPARK = {"method": "dspark", "trained": True, "not_served": "vLLM serves DSpark only with its V2 model runner",
          "cells": []}
FAMILIES = results_of({"eagle3": EAGLE3, "dflash": grid.evaluation("dflash", {(7, 2): (1.1, 1.6), (7, 8): (0.5, 1.6)}),
                       "dspark": DSPARK, "ngram": NGRAM_EVALUATION})
DFLASH_TRAINING = {**TRAINING, "family": "dflash",
                   "mask_token": {"id": 16, "why": "special token '<x>', never in the data"},
                   "validation": [{"epoch": 0, "loss_epoch": 2.1, "full_acc_epoch": 0.1, "position_1_acc_epoch": 0.2,
                                   "position_2_acc_epoch": 0.05, "eal_epoch": 1.3, "simulated_tau": 1.3}]}


def test_every_family_side_by_side_and_the_pick_explained(tmp_path):
    text = report(tmp_path, Inputs(FAMILIES, GENERATION, PROMPTS, MERGE, VOCAB, DFLASH_TRAINING, GATE))
    assert ("**Picked: DFlash** by speed-up at concurrency 2: best speed-up 1.100 at concurrency 2, 7 draft tokens, "
            "+22.2% over eagle3 (0.900)") in text
    assert "| DFlash ✔ | 7 | everyday | 0 | 1.600 | 1.600 | 0.40, 0.10 | 44.0 | 1.10× | 2.0 min | 3.0 MiB |" in text
    assert "| EAGLE-3 | 3 | everyday | 1 | 1.300 |" in text
    assert "| DSpark | – | – | – | not served here | – | vLLM serves DSpark only with its V2 model runner |" in text
    assert "speculators DFlash" in text and "| epoch | loss | position_1_acc | position_2_acc |" in text
    assert "![drafter families](families.png)" in text
    from draftsmith.evaluation.render.model_card import CardInputs, card

    dflash = {"transformer_layer_config": {"num_hidden_layers": 2}, "block_size": 8, "mask_token_id": 16}
    text = card(CardInputs(base_model="b/m", config_digest="0", datasets={}, results=FAMILIES,
                           training=DFLASH_TRAINING, merge=MERGE, prompts=PROMPTS,
                           train_config={"epochs": 3, "lr": 1e-3, "optimizer": "muon", "scheduler": "linear",
                                         "total_seq_len": 1024, "loss_fn": None},
                           drafter_config=dflash, sglang_reason="a dflash drafter: SGLang's export is EAGLE-3's"))
    assert text.split("---\n")[2].lstrip().startswith("# DFlash drafter for b/m") and "- dflash" in text
    assert "--speculative-algorithm" not in text
    assert "2 draft layer(s), blocks of 8 positions, mask token 16 (special token '<x>', never in the data)" in text
    assert "## Why this family" in text and "| DFlash | 7 | 1.600 | 1.10× |" in text
    assert "| DSpark | – | not served here: vLLM serves DSpark only with its V2 model runner | – |" in text
    # The serving recipe: a command per concurrency band with what was measured there, and the
    # training-free method that beat the drafter at concurrency 8, said plainly, with its command.
    assert "### Batch sizes 1 to 7 (measured at concurrency 2)" in text
    assert "### Batch size 8 (measured at concurrency 8); above 8 unmeasured, served at its setting" in text
    assert ("vllm serve b/m --speculative-config '{\"method\": \"dflash\", \"model\": \".\", "
            "\"num_speculative_tokens\": 7}'") in text
    assert "DFlash, 7 draft tokens: speed-up 1.10×, 1.600 tokens per target step" in text
    assert "**n-gram, which needs no drafter, beat this drafter here**: 1 draft token, speed-up 1.05×" in text
    assert "speed-up 1.050 against this drafter's 0.500" in text
    # On a GPU, where at 8 the target alone beat DFlash (0.50×) and n-gram beat both, the card names n-gram and
    # never also says to serve without speculation there.
    on_gpus = card(CardInputs(base_model="b/m", config_digest="0", datasets={},
                              results={**FAMILIES, "on_accelerator": True}, training=DFLASH_TRAINING, merge=MERGE,
                              prompts=PROMPTS, train_config={"epochs": 3, "lr": 1e-3, "optimizer": "muon",
                                                             "scheduler": "linear", "total_seq_len": 1024,
                                                             "loss_fn": None},
                              drafter_config=dflash, sglang_reason="not EAGLE-3"))
    band_8 = band_by_band(on_gpus).split(
        "### Batch size 8 (measured at concurrency 8)")[1]
    assert "The target alone was faster than DFlash here at every draft length (its best, 7 draft tokens: " \
        "speed-up 0.50×" in band_8 and "Serve without speculation" not in band_8 and "vllm serve b/m\n" not in band_8
    assert "**n-gram, which needs no drafter, beat this drafter here**" in band_8
    assert "Serve without speculation" not in band_by_band(on_gpus).split(
        "### Batch size 8 (measured at concurrency 8)")[0]
    assert "speed-ups that matter" not in on_gpus
    assert ('"method": "ngram", "num_speculative_tokens": 1, "prompt_lookup_min": 2, "prompt_lookup_max": 4}' in text)
    assert "Measure on your GPUs with `./run.sh` and `server.gpus` set before serving it there." in text


def test_a_suffix_winner_is_recommended_as_it_was_measured_without_its_tree_of_earlier_answers():
    """The grid sends each prompt more than once: with vLLM's default tree of earlier answers, suffix
    decoding at T=0 drafted the very answer it had given before. The card's command is the setting measured."""
    from draftsmith.evaluation.render.model_card import card

    suffix = grid.evaluation("suffix", {(3, 2): (0.7, 1.2), (3, 8): (1.2, 1.5)}, trained=False)
    text = card(card_inputs(results_of({"eagle3": EAGLE3, "suffix": suffix})))
    assert ("**suffix decoding, which needs no drafter, beat this drafter here**: 3 draft tokens, speed-up 1.20×, "
            "1.500 tokens per target step (τ per draft 1.500); speed-up 1.200 against this drafter's 0.700") in text
    assert ('{"method": "suffix", "num_speculative_tokens": 3, "suffix_decoding_max_cached_requests": 0}'
            in text)
    assert "measured without its tree of earlier answers" in text


def test_a_training_free_method_that_beat_the_published_drafter_is_named_though_another_family_beat_it_too():
    """EAGLE-3 published, DFlash best at 16, n-gram at 1.10× against EAGLE-3's 0.90×: the card for 16
    recommended EAGLE-3 at 0.90× and never named n-gram (its block showed only when n-gram beat every trained
    family)."""
    from draftsmith.evaluation.render.model_card import card

    eagle3 = grid.evaluation("eagle3", {(3, 1): (1.5, 1.8), (3, 16): (0.9, 1.8)})
    dflash = grid.evaluation("dflash", {(7, 1): (1.2, 1.7), (7, 16): (1.3, 2.0)})
    ngram = grid.evaluation("ngram", {(3, 1): (1.0, 1.1), (3, 16): (1.1, 1.2)}, trained=False)
    results = {**results_of({"eagle3": eagle3, "dflash": dflash, "ngram": ngram}, pick_at=1), "on_accelerator": True}
    assert results["family"] == "eagle3"
    band_16 = band_by_band(card(card_inputs(results))).split(
        "### Batch size 16 (measured at concurrency 16)")[1].split("## ")[0]
    assert "**n-gram, which needs no drafter, beat this drafter here**: 3 draft tokens, speed-up 1.10×" in band_16
    # its command is on the first screen, first at its band, and not repeated below
    screen = card(card_inputs(results)).split("## What to serve")[1].split("\n## ")[0].split("concurrency 16")[1]
    assert screen.index('"method": "ngram", "num_speculative_tokens": 3') < screen.index('"method": "eagle3"')
    assert "The command is under What to serve, above." in band_16 and "vllm serve" not in band_16
    # on GPUs the target alone beat EAGLE-3's 0.90× too, but n-gram beat both: only n-gram is served there
    assert "Serve without speculation" not in band_16 and "The target alone was faster than EAGLE-3 here" in band_16


def test_windows_whose_target_alone_disagrees_are_flagged_and_the_pick_names_it(tmp_path):
    """The same target on the same prompts read 175-185 tok/s in EAGLE-3's window and 38-48 in suffix's: the
    report's headline crowned suffix decoding on a 4.8x load change. Tokens per step, which load does not
    touch, is what the pick should be read by there."""
    from draftsmith.evaluation.render.model_card import card

    eagle3 = grid.evaluation("eagle3", {(3, 8): (1.04, 1.76)})
    suffix = grid.evaluation("suffix", {(3, 8): (2.05, 1.81)}, trained=False)
    for point in suffix["baseline"]:
        for run in point["runs"]:
            run["output_tok_s"] = 40.0 / 4.8
    results = results_of({"eagle3": eagle3, "suffix": suffix}, pick_at=8)
    changed = results["load_changed"]
    assert [(c["concurrency"], c["set"]) for c in changed] == [(8, "everyday"), (8, "everyday")]
    assert changed[0]["spread"] == pytest.approx(3.8) and results["serving"][0]["load_changed"] == changed
    text = report(tmp_path, Inputs(results, GENERATION, PROMPTS, MERGE, VOCAB, TRAINING, GATE))
    assert "## The machine's load changed between measurements" in text
    assert "- concurrency 8, everyday, T=0: EAGLE-3 40 tok/s, suffix decoding 8.3 tok/s (+380%)" in text
    assert "## The machine's load changed" in card(card_inputs(results))
    # On a CPU, where each method measures its own baseline, no pick rests on these speed-ups: it ranks by
    # tokens per step, which load does not touch; on GPUs the target alone is measured once.
    from draftsmith.core import platform

    assert platform.ranking_figure("speedup", "cpu") == "tau" and platform.ranking_figure("speedup", "cuda") == \
        "speedup"
    # one baseline for the whole grid (GPUs): nothing to disagree with
    shared = {m: {**e, "baseline_shared": True} for m, e in (("eagle3", eagle3), ("suffix", suffix))}
    assert pick.load_changes(shared) == []
    # the report says where each baseline was measured: a method placed on other GPUs measured its own
    from draftsmith.evaluation.render.report import _baselines

    assert _baselines(shared) == "measured once for the whole grid (GPUs, measured one at a time)."
    assert _baselines({**shared, "suffix": suffix}).endswith(
        "; suffix measured it again in its own job, on other GPUs.")
    assert _baselines({"eagle3": eagle3, "suffix": suffix}) == "measured in the same job."


def test_tokens_per_step_at_shorter_draft_lengths_are_derived_at_t0_and_checked_against_the_cells_measured():
    """At T=0 EAGLE-3's first k drafts do not depend on the longest k: its acceptance by position there gives
    tokens per step at every shorter length, and a grid ranked by tokens per step need not serve each."""
    from draftsmith.evaluation.decide.pick import derived_tokens_per_step
    from draftsmith.evaluation.render.report import derived_lengths

    # 100 drafted steps at k=3 accepting 40, 20, 10 at positions 1-3: 170 tokens over 100 steps
    acceptance = {"tokens_per_step": 1.7, "acceptance_rate_per_position": [0.4, 0.2, 0.1]}
    assert derived_tokens_per_step(acceptance, 1) == pytest.approx(1.4)
    assert derived_tokens_per_step(acceptance, 2) == pytest.approx(1.6)
    assert derived_tokens_per_step(acceptance, 4) is None
    # n-gram drafts on 1 step in 2: 150 tokens over 100 steps, 50 drafted, accepting 30 then 20
    assert derived_tokens_per_step({"tokens_per_step": 1.5, "acceptance_rate_per_position": [0.6, 0.4]}, 1) == \
        pytest.approx(1.3)
    lines = derived_lengths(RESULTS)
    assert "| EAGLE-3 | 2 | 1 | 1.240 | 1.200 |" in lines  # k=3's (0.4, 0.1) at T=0 against the k=1 cell measured
    assert not any(line.startswith("| n-gram | 2 | 1 | ") and "–" in line for line in lines)


def test_plain_serving_wins_a_tie_and_the_grid_is_ranked_on_the_device_it_was_measured_on():
    """A method that merely draws level with the target alone is not worth serving. And the device comes
    from a method that was measured: a first family left out (its gate failed) records none of its own."""
    level = grid.evaluation("ngram", {(3, 4): (1.0, 1.0)}, trained=False)
    entry = pick.serving({"ngram": level}, [4], "tau")[0]
    assert entry["plain_wins"] and entry["best"]["method"] == "plain"
    skipped = {"method": "dflash", "trained": True, "failed": "gate", "baseline": [], "cells": []}
    measured = {**grid.evaluation("eagle3", {(3, 4): (1.2, 1.5)}), "device": "cuda"}
    assert pick.measured_on({"dflash": skipped, "eagle3": measured}) == "cuda"


def test_on_gpus_a_training_free_method_slower_than_the_target_alone_is_not_recommended():
    """A band said "Serve without speculation here" and then "n-gram ... Serve it instead" at 0.95×."""
    from draftsmith.evaluation.render.model_card import card

    eagle3 = {**grid.evaluation("eagle3", {(3, 1): (1.5, 1.8), (3, 16): (0.8, 1.8)}), "on_accelerator": True}
    ngram = {**grid.evaluation("ngram", {(3, 1): (1.0, 1.1), (3, 16): (0.95, 1.2)}, trained=False),
             "on_accelerator": True}
    results = results_of({"eagle3": eagle3, "ngram": ngram}, pick_at=1)
    band_16 = band_by_band(card(card_inputs(results))).split(
        "### Batch size 16 (measured at concurrency 16)")[1].split("## ")[0]
    assert "Serve without speculation here" in band_16 and "n-gram" not in band_16
    screen = card(card_inputs(results)).split("## What to serve")[1].split("\n## ")[0].split("concurrency 16")[1]
    assert screen.index("Serve without speculation") < screen.index('"method": "eagle3"') and "ngram" not in screen
    on_cpu = band_by_band(card(card_inputs({**results, "on_accelerator": False}))).split(
        "### Batch size 16 (measured at concurrency 16)")[1]
    assert "**n-gram, which needs no drafter, beat this drafter here**" in on_cpu.split("## ")[0]


def test_the_gate_shows_no_ratio_over_a_zero_prediction_and_says_whether_it_can_tell(tmp_path):
    """A gate.json from before showed a third position's ratio of 13,618,832 where the prediction was about zero,
    marked too few to judge: the table shows none there. A sampled gate says, in the report and the card alike,
    whether its band over rows is narrower than the tolerance, or how many rows would be."""
    from draftsmith.evaluation.render.model_card import card
    from draftsmith.training.export import resolution_text, thresholds_of

    resolution = {"rows": 19, "samples": 8, "seed": 42, "can_tell": False, "band": 0.061, "tolerance": 0.035,
                  "rows_needed": 58}
    gate = {**GATE, "acceptance": {"drafts": 1019, "acceptance_rate_per_position": [0.126, 0.008, 0.004]},
            "predicted": {"rows": 19, "drafts": 999, "acceptance_rate_per_position": [0.175, 0.025, 2.9e-10]},
            "positions": [{"position": 1, "predicted": 0.175, "served": 0.126, "ratio": 0.72, "flag": False,
                           "spread": 0.02},
                          {"position": 2, "predicted": 0.025, "served": 0.008, "ratio": 0.31, "flag": True,
                           "direction": "below"},
                          {"position": 3, "predicted": 2.9e-10, "served": 0.004, "ratio": 13618832.0, "flag": None,
                           "predicted_accepted": 2.9e-7}],
            "resolution": resolution}
    told = resolution_text(resolution, thresholds_of(gate))
    assert "this gate cannot tell sampling from a fault at this size; about 58 rows would" in told
    text = report(tmp_path, Inputs(RESULTS, GENERATION, PROMPTS, MERGE, VOCAB, TRAINING, gate, gates={"eagle3": gate}))
    shown = card(card_inputs(RESULTS, gate=gate))
    for rendered in (text, shown):
        assert "| 3 | 0.000 | 0.004 | – | too few to judge (2.9e-07 predicted accepted) |" in rendered
        assert "13618832" not in rendered and f"Sampled, {told}." in rendered

def test_the_report_and_the_card_show_served_against_predicted_by_position_and_flag_a_shortfall(tmp_path):
    """speculators#613: good validation metrics, acceptance ≈ 1.05 in vLLM. The gate's served acceptance
    stands beside the drafter's own prediction on the same rows and window, each position's ratio given and
    one below 0.8 flagged."""
    from draftsmith.evaluation.render.model_card import card

    gate = {**GATE, "acceptance": {"drafts": 115, "acceptance_rate_per_position": [0.2, 0.01, 0.0]},
            "predicted": {"rows": 8, "drafts": 112, "acceptance_rate_per_position": [0.232, 0.027, 0.0]},
            "positions": [{"position": 1, "predicted": 0.232, "served": 0.2, "ratio": 0.862, "flag": False},
                          {"position": 2, "predicted": 0.027, "served": 0.01, "ratio": 0.370, "flag": True},
                          {"position": 3, "predicted": 0.0, "served": 0.0, "ratio": None, "flag": None,
                           "predicted_accepted": 0}]}
    text = report(tmp_path, Inputs(RESULTS, GENERATION, PROMPTS, MERGE, VOCAB, TRAINING, gate,
                                   gates={"eagle3": gate, "dflash": {"passed": True, "verdict": "old gate"}}))
    assert "## Served against predicted, by position" in text
    assert "| 1 | 0.232 | 0.200 | 0.86 |  |" in text and "| 2 | 0.027 | 0.010 | 0.37 | **below 0.8** |" in text
    assert "| 3 | 0.000 | 0.000 | – | too few to judge (0 predicted accepted) |" in text
    assert "Over 8 rows: 112 drafts predicted, 115 served." in text
    assert "| 2 | 0.027 | 0.010 | 0.37 | **below 0.8** |" in card(card_inputs(RESULTS, gate=gate))
    assert "Served against predicted" not in card(card_inputs(RESULTS, gate=GATE))  # a gate from before: none


def test_every_predicted_figure_says_exact_or_estimate_and_a_replay_that_did_not_run_says_why(tmp_path):
    """Sampled answers make the replay an estimate: the report, the card and the gate's table say so with the
    agreement share. A replay that failed, was skipped (online hidden states) or had no rows is named where the
    figure would stand."""
    from draftsmith.evaluation.render.model_card import card

    estimate = {"basis": "estimate", "agreement": 0.874, "positions": 900}
    served = {"rows": 20, "k": 3, "tokens_per_step": 1.3, "exactness": estimate,
              "without_looping_rows": {"rows": 18, "tokens_per_step": 1.25},
              "by_k": {"1": {"tokens_per_step": 1.2, "without_looping_rows": {"rows": 18, "tokens_per_step": 1.18}},
                       "3": {"tokens_per_step": 1.3, "without_looping_rows": {"rows": 18, "tokens_per_step": 1.25}}}}
    training = {**TRAINING, "validation": [{**e, "predicted_served": served} for e in TRAINING["validation"]]}
    gate = {**GATE, "acceptance": {"drafts": 115, "acceptance_rate_per_position": [0.3, 0.02, 0.0]},
            "predicted": {"rows": 8, "drafts": 112, "acceptance_rate_per_position": [0.2, 0.027, 0.0],
                          "exactness": estimate},
            "positions": [{"position": 1, "predicted": 0.2, "served": 0.3, "ratio": 1.5, "flag": True,
                           "direction": "above"}]}
    text = report(tmp_path, Inputs(RESULTS, GENERATION, PROMPTS, MERGE, VOCAB, training, gate, gates={"eagle3": gate}))
    label = "estimate: the stored greedy answers' tokens are the target's argmax at 87.4% of positions"
    assert f"Predicted served τ at k=3: {label} (where a greedy answer's stored token is not the target's argmax, " \
        "a near-tie" in text
    assert "Each served draft length's own walk (without looping rows): epoch 1 k=1 1.180, k=3 1.250;" in text
    assert "| 1 | 0.200 | 0.300 | 1.50 | **above 1.25** |" in text and f"Predicted: {label}" in text
    assert f"Predicted: {label}" in card(card_inputs(RESULTS, gate=gate))
    sampled = {"basis": "estimate", "agreement": None, "positions": 0,
               "sampled": {"positions": 900, "sampling": [{"temperature": 0.6, "top_p": 0.95}], "expected": True}}
    gate = {**gate, "predicted": {**gate["predicted"], "exactness": sampled}}
    training = {**TRAINING, "validation": [{**e, "predicted_served": {**served, "exactness": sampled}}
                                           for e in TRAINING["validation"]]}
    text = report(tmp_path, Inputs(RESULTS, GENERATION, PROMPTS, MERGE, VOCAB, training, gate, gates={"eagle3": gate}))
    label = ("estimate: 900 answer tokens sampled (T=0.6, top_p 0.95), walked as a server sampling alike accepts "
             "them, each step by its expected acceptance: one path each, for serving at that sampling, not greedily")
    assert f"Predicted served τ at k=3: {label}." in text and f"Predicted: {label}." in text
    near = {**gate, "positions": [{"position": 1, "predicted": 0.2, "served": 0.26, "ratio": 1.3, "spread": 0.03,
                                   "flag": False, "direction": None}]}
    assert "| 1 | 0.200 | 0.260 | 1.30 | within the two samples' spread (±0.090) |" in card(card_inputs(RESULTS,
                                                                                                    gate=near))
    assert f"Predicted: {label}." in card(card_inputs(RESULTS, gate=gate))

    online = {**TRAINING, "validation": [{**e, "predicted_served_skipped": "skipped: online hidden states, none "
                                          "stored to replay on"} for e in TRAINING["validation"]]}
    failed = {**TRAINING, "validation": [{**e, "predicted_served_failed": "OutOfMemoryError: CUDA out of memory"}
                                         for e in TRAINING["validation"]]}
    no_prediction = {**GATE, "served": True, "predicted": None, "positions": [],
                     "predicted_missing": "skipped: online hidden states, none stored to replay on"}
    text = report(tmp_path, Inputs(RESULTS, GENERATION, PROMPTS, MERGE, VOCAB, online, no_prediction,
                                   gates={"eagle3": no_prediction}))
    assert "No predicted served τ: skipped: online hidden states, none stored to replay on; the simulated τ" in text
    assert "No prediction to set beside the served acceptance: skipped: online hidden states" in text
    assert "No prediction to set beside the served acceptance: skipped" in card(card_inputs(RESULTS,
                                                                                            gate=no_prediction))
    text = report(tmp_path, Inputs(RESULTS, GENERATION, PROMPTS, MERGE, VOCAB, failed, GATE))
    assert "No predicted served τ: the replay failed (OutOfMemoryError: CUDA out of memory)" in text


def test_sglang_figures_say_their_windows_include_the_drain_in_the_card_and_the_report():
    """SGLang counts a request's tokens when it ends, so its windows are timed to the last answer: labelled
    'at concurrency c' alone, the speed-ups hid the tail below c that they include."""
    import copy

    from draftsmith.evaluation.render import model_card
    from draftsmith.evaluation.render.report import _serving

    note = ("SGLang counts a request's tokens when it ends: these windows run to the last answer, so the tail "
            "below concurrency c is inside them.")
    sglang = copy.deepcopy(RESULTS)
    for evaluation in sglang["methods"].values():
        for cell in evaluation["cells"]:
            for run in cell["runs"]:
                run["tokens_counted"] = "completed requests"
    assert note in model_card.serving(card_inputs(sglang)) and note in _serving(sglang)
    assert note not in model_card.serving(card_inputs(RESULTS)) and note not in _serving(RESULTS)
