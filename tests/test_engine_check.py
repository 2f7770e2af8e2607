"""The engine check: a weightless twin of the target with its attention and cache shapes, a random drafter
of each family, and vLLM's verdict on the pair before any work."""

from __future__ import annotations

import json
import os
import re

import pytest

from draftsmith.ops import engine_check as ec
from tests.tiny_targets import build, config_of

# What the engine pairs with a drafter's cache: attention and KV-cache geometry, rope, dtype, and the
# keys that choose the model's code. The twin must keep each as the target has it.
SHAPE_KEYS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "kv_lora_rank", "q_lora_rank",
              "qk_rope_head_dim", "qk_nope_head_dim", "qk_head_dim", "v_head_dim", "rope_parameters", "rope_scaling",
              "rope_theta", "rope_interleave", "sliding_window", "use_sliding_window", "max_position_embeddings",
              "torch_dtype", "dtype", "model_type", "architectures", "auto_map", "attention_bias", "rms_norm_eps",
              "quantization_config", "tie_word_embeddings", "hidden_act", "scoring_func", "topk_method",
              "routed_scaling_factor", "norm_topk_prob", "num_nextn_predict_layers")
ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
                 "deepseek_v3": "DeepseekV3ForCausalLM"}


def deepseek_v3_shaped(experts: int, heads: int, vocab: int) -> dict:
    """A full-size DeepSeek-V3 / Kimi-K2 config.json as the hub has it (61 layers, 7168 wide, MLA, fp8)."""
    return {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config",
                     "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"},
        "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
        "num_attention_heads": heads, "num_key_value_heads": heads, "n_routed_experts": experts, "n_shared_experts": 1,
        "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4, "first_k_dense_replace": 3, "moe_layer_freq": 1,
        "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
        "num_nextn_predict_layers": 1, "rope_theta": 10000,
        "rope_scaling": {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
                         "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096},
        "max_position_embeddings": 163840, "vocab_size": vocab, "torch_dtype": "bfloat16", "hidden_act": "silu",
        "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
        "norm_topk_prob": True, "routed_scaling_factor": 2.5, "bos_token_id": 0, "eos_token_id": 1,
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                "weight_block_size": [128, 128]}}


def parameters(config: dict) -> int:
    """The parameters transformers builds for a DeepSeek-V3-family config (on the meta device: no memory)."""
    import torch
    import transformers

    kept = {k: v for k, v in config.items() if k not in ("auto_map", "quantization_config", "model_type")}
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.DeepseekV3Config(**kept))
    return sum(p.numel() for p in model.parameters())


def assert_shapes_kept(config: dict, twin: dict) -> None:
    assert set(config) <= set(twin)  # nothing dropped, unknown keys included
    for key in SHAPE_KEYS:
        if key in config:
            assert twin[key] == config[key], key


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_a_tiny_targets_twin_keeps_its_attention_and_cache_shapes(arch):
    config = {**config_of(arch).to_dict(), "architectures": [ARCHITECTURES[arch]]}
    twin = ec.twin_config(config)
    assert_shapes_kept(config, twin)
    assert twin["num_hidden_layers"] == 4 and twin["vocab_size"] == 151936  # a small embedding: vocabulary kept
    assert twin == config  # already the smallest twin: four layers, four experts, 64-256 wide MLPs


@pytest.mark.parametrize("name, experts, heads, vocab", [("deepseek-v3", 256, 128, 129280),
                                                          ("kimi-k2", 384, 128, 163840)])
def test_a_1t_targets_twin_is_tiny_with_the_same_attention(name, experts, heads, vocab):
    config = deepseek_v3_shaped(experts, heads, vocab)
    twin = ec.twin_config(config)
    assert_shapes_kept(config, twin)
    assert twin["num_hidden_layers"] == 4 and twin["first_k_dense_replace"] == 1  # a dense and three MoE layers
    assert twin["n_routed_experts"] == 4 and twin["num_experts_per_tok"] == 2
    assert twin["n_group"] == twin["topk_group"] == 1  # 4 experts in 8 groups would not route
    assert twin["intermediate_size"] == 256 and twin["moe_intermediate_size"] == 128  # whole fp8 128-blocks
    assert twin["vocab_size"] == 18688 and twin["vocab_size"] * 7168 <= ec.VOCAB_PARAMS_BUDGET
    full, small = parameters(config), parameters(twin)
    assert full > 600e9  # the meta count is the real model's (671B for DeepSeek-V3)
    assert small < 1.1e9, small  # ~2 GB in bf16: vLLM dummy-initialises it in seconds
    # the four MLA layers are most of it: 128 heads of 7168-wide attention, as the target has
    assert small > 4 * 128 * 128 * 7168


def test_a_multimodal_target_changes_its_text_config_only():
    text = deepseek_v3_shaped(384, 64, 163840)
    config = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
              "auto_map": {"AutoConfig": "configuration_kimi_k25.KimiK25Config"}, "text_config": text,
              "vision_config": {"num_hidden_layers": 27, "hidden_size": 1152}, "media_placeholder_token_id": 163605}
    twin = ec.twin_config(config)
    assert {k: v for k, v in twin.items() if k != "text_config"} == {k: v for k, v in config.items()
                                                                      if k != "text_config"}
    assert_shapes_kept(text, twin["text_config"])
    assert twin["text_config"]["num_hidden_layers"] == 4 and twin["text_config"]["n_routed_experts"] == 4


@pytest.mark.parametrize("kinds, expected", [
    (["sliding_attention"] * 5 + ["full_attention"], {"sliding_attention", "full_attention"}),  # Gemma-3
    (["linear_attention"] * 3 + ["full_attention"], {"linear_attention", "full_attention"}),  # Qwen3-Next
    (["full_attention", "sliding_attention"], {"full_attention", "sliding_attention"}),  # gpt-oss
])
def test_a_hybrid_targets_twin_keeps_every_kind_of_layer(kinds, expected):
    config = {"model_type": "x", "num_hidden_layers": 48, "layer_types": (kinds * 48)[:48],
              "no_rope_layers": [i % 4 != 3 for i in range(48)], "mlp_only_layers": [0, 5, 40]}
    twin = ec.twin_config(config)
    picks = ec.picked_layers(config)
    assert len(picks) == twin["num_hidden_layers"] == 4 and set(twin["layer_types"]) == expected
    assert twin["layer_types"] == [config["layer_types"][i] for i in picks]
    assert twin["no_rope_layers"] == [config["no_rope_layers"][i] for i in picks]
    assert twin["mlp_only_layers"] == [picks.index(i) for i in (0, 5, 40) if i in picks]  # renumbered


def test_a_sharded_server_gets_a_twin_each_shard_can_hold():
    args = ["--tensor-parallel-size", "4", "--data-parallel-size=2", "--enable-expert-parallel"]
    assert ec.parallel_shards(args) == 8 and ec.parallel_shards(["-tp", "8"]) == 8 and ec.parallel_shards([]) == 1
    twin = ec.twin_config(deepseek_v3_shaped(384, 64, 163840), shards=8)
    assert twin["n_routed_experts"] == 8 and twin["moe_intermediate_size"] == 8 * 128
    assert twin["intermediate_size"] == 8 * 256


def test_the_twin_folder_has_the_targets_files_but_no_weights(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(deepseek_v3_shaped(256, 128, 129280)))
    for name in ("tokenizer.json", "tokenizer_config.json", "tiktoken.model", "chat_template.jinja",
                 "generation_config.json", "modeling_deepseek.py", "configuration_deepseek.py",
                 "model-00001-of-00163.safetensors", "model.safetensors.index.json", "pytorch_model.bin"):
        (target / name).write_text("x")
    (target / "original").mkdir()
    twin = ec.write_twin(target, tmp_path / "twin")
    assert sorted(p.name for p in twin.iterdir()) == [
        "chat_template.jinja", "config.json", "configuration_deepseek.py", "generation_config.json",
        "modeling_deepseek.py", "tiktoken.model", "tokenizer.json", "tokenizer_config.json"]
    assert json.loads((twin / "config.json").read_text())["num_hidden_layers"] == 4


def tiny_twin(tmp_path):
    """A twin of a small Qwen3 (1024 tokens, 64 wide): speculators builds drafters for it in a second."""
    import transformers

    target = tmp_path / "target"
    target.mkdir()
    config = transformers.Qwen3Config(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                                      num_attention_heads=2, num_key_value_heads=1, head_dim=32)
    (target / "config.json").write_text(json.dumps({**config.to_dict(), "architectures": ["Qwen3ForCausalLM"]}))
    return ec.write_twin(target, tmp_path / "twin")


def test_random_drafters_are_exported_as_training_exports_them(tmp_path):
    twin = tiny_twin(tmp_path)
    shapes = ec.drafter_shapes({"num_layers": 1, "draft_arch": "qwen3", "architecture": "eagle3", "fc_norm": False,
                                "train_lm_head": False, "dflash": {"num_layers": 2, "block_size": 4}, "dspark": {}})
    assert shapes["dflash"] == {"num_layers": 2, "block_size": 4} and shapes["dspark"] == {}
    eagle3 = ec.random_drafter(twin, "eagle3", tmp_path / "eagle3", **ec.drafter_kwargs("eagle3", shapes["eagle3"]))
    dflash = ec.random_drafter(twin, "dflash", tmp_path / "dflash", **ec.drafter_kwargs("dflash", shapes["dflash"]))
    for drafter, family in ((eagle3, "eagle3"), (dflash, "dflash")):
        config = json.loads((drafter / "config.json").read_text())
        assert (drafter / "final.safetensors").is_file()
        assert config["speculators_model_type"] == family and config["draft_vocab_size"] == ec.DRAFT_VOCAB
        assert config["speculators_config"]["verifier"]["name_or_path"] == str(twin)  # the twin, not the stub
    eagle3_config = json.loads((eagle3 / "config.json").read_text())
    assert eagle3_config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert eagle3_config["transformer_layer_config"]["model_type"] == "qwen3"
    assert eagle3_config["norm_before_residual"] is False  # train.architecture eagle3's flags
    dflash_config = json.loads((dflash / "config.json").read_text())
    assert dflash_config["block_size"] == 4 and dflash_config["mask_token_id"] == 1023
    assert dflash_config["transformer_layer_config"]["num_hidden_layers"] == 2
    assert not list(twin.glob("*.safetensors"))  # speculators read the stub beside it


def test_a_family_the_engine_here_cannot_serve_is_not_started(tmp_path, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("started")

    monkeypatch.setattr(ec, "random_drafter", never)
    monkeypatch.setattr(ec, "_served", never)
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(config_of("qwen3").to_dict()))
    results = ec.check(target, ["dspark"], {"gpus": 0, "extra_args": []}, tmp_path / "work", tmp_path / "logs")
    assert results["dspark"]["served"] is None and "V2 model runner" in results["dspark"]["skipped"]
    assert ec.failure_message(results, "t", on_gpus=False) is None


# From a vLLM 0.32 CPU server log: a DeepSeek-V3-shaped twin with an EAGLE-3 drafter and the hybrid
# KV-cache manager off (one cache group, MLA's block of 16 for both).
VLLM_LOG = """\
(APIServer pid=20972) WARNING 12-05 08:45:23 [system_utils.py:255] Found ulimit of 20000 and failed to \
automatically increase with error current limit exceeds maximum limit. This can cause fd limit errors like \
`OSError: [Errno 24] Too many open files`. Consider increasing with ulimit -n
(Worker pid=21036) ERROR 12-05 08:45:41 [multiproc_executor.py:1063]     raise ValueError(
(Worker pid=21036) ERROR 12-05 08:45:41 [multiproc_executor.py:1063] ValueError: No common block size for 16 \
(CPU_MLA: [16]; CPU_ATTN: [MultipleOf(32)]).
(EngineCore pid=20999) ERROR 12-05 08:45:41 [core.py:1510]     raise RuntimeError(
(EngineCore pid=20999) ERROR 12-05 08:45:41 [core.py:1510] RuntimeError: Worker failed with error 'No common block \
size for 16 (CPU_MLA: [16]; CPU_ATTN: [MultipleOf(32)]).', please check the stack trace above for the root cause
    raise RuntimeError(
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore': 1}
"""


def test_the_key_line_of_a_failed_servers_log_is_its_root_cause():
    assert ec.key_error_line(VLLM_LOG) == "ValueError: No common block size for 16 (CPU_MLA: [16]; CPU_ATTN: " \
                                          "[MultipleOf(32)])."
    wrapped = "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"
    assert ec.key_error_line(wrapped) == wrapped  # only a wrapper: better than nothing
    assert ec.key_error_line("INFO all good\n") is None


def test_the_failure_names_each_family_its_error_and_what_to_do():
    results = {"eagle3": {"served": False, "error": "ValueError: No common block size for 16", "log": "l/e.log"},
               "dflash": {"served": True, "drafts": 15, "error": None},
               "dspark": {"served": None, "skipped": "GPUs only"}}
    message = ec.failure_message(results, "kimi", on_gpus=False)
    assert "\n" not in message and "target kimi with a drafter of family eagle3 (eagle3: ValueError: No common" \
        in message
    assert "serve on GPUs (server.gpus)" in message and "leave eagle3 out of train.families" in message
    assert "server.engine_check: false" in message and "l/e.log" in message and "dflash" not in message
    assert "serve on GPUs" not in ec.failure_message(results, "kimi", on_gpus=True)


def run_adapter(tmp_path, monkeypatch, results: dict | None, engine_check: bool = True, earlier: dict | None = None,
                families: list[str] | None = None):
    """scripts/engine_check.py as Snakemake runs it, with ``check`` answering ``results`` (for the families it
    is asked about) and the preflight's verdicts ``earlier``."""
    import runpy
    import sys
    from types import SimpleNamespace

    from tests.conftest import REPO

    monkeypatch.setattr(sys, "stderr", sys.stderr)  # run() points stderr at the job's log
    asked = []

    def check(target_dir, todo, *args, **kwargs):
        asked.extend(todo)
        return {f: results[f] for f in todo}

    monkeypatch.setattr(ec, "check", check)
    target = tmp_path / "target"
    target.mkdir(parents=True)
    (target / "config.json").write_text(json.dumps(config_of("qwen3").to_dict()))
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "results" / "checks" / "engine.json"
    out.parent.mkdir(parents=True)
    if earlier:
        ec.BEFORE_WORK.parent.mkdir(parents=True)
        ec.BEFORE_WORK.write_text(json.dumps(earlier))
    sm = SimpleNamespace(config={"target": {"name": "tiny", "source": str(target)},
                                 "server": {"gpus": 0, "engine_check": engine_check}},
                         params=SimpleNamespace(families=families or list(results or []), shapes={}),
                         output=[str(out)],
                         log=[str(tmp_path / "engine_check.log")], threads=1, resources=SimpleNamespace(gpu=0),
                         scriptdir=str(REPO / "scripts"))
    runpy.run_path(str(REPO / "scripts" / "engine_check.py"), init_globals={"snakemake": sm}, run_name="__main__")
    run_adapter.asked = asked
    return out


def test_the_rule_fails_in_one_line_naming_the_family_and_what_to_do(tmp_path, monkeypatch, capsys):
    results = {"eagle3": {"served": False, "seconds": 40.0, "drafts": None, "log": "logs/engine_check/eagle3.log",
                          "error": "ValueError: No common block size for 16 (CPU_MLA: [16]; CPU_ATTN: "
                                   "[MultipleOf(32)])."},
               "dflash": {"served": True, "seconds": 40.0, "drafts": 15, "error": None}}
    with pytest.raises(SystemExit):
        run_adapter(tmp_path, monkeypatch, results)
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("draftsmith: ValueError: engine check: vLLM cannot serve "
                                                          "target tiny with a drafter of family eagle3")
    assert "No common block size for 16" in err and "leave eagle3 out of train.families" in err


def test_the_rule_writes_the_verdicts_or_skips_when_switched_off(tmp_path, monkeypatch):
    served = {"eagle3": {"served": True, "seconds": 40.0, "drafts": 15, "error": None}}
    written = json.loads(run_adapter(tmp_path / "a", monkeypatch, served).read_text())
    assert written == {"eagle3": {**served["eagle3"], "key": ec.key("eagle3", {}, {"gpus": 0, "engine_check": True})}}
    off = run_adapter(tmp_path / "b", monkeypatch, None, engine_check=False)
    assert json.loads(off.read_text()) == {"skipped": "server.engine_check is false"}


def test_the_pick_reads_the_verdicts_made_before_work_and_checks_only_a_family_added_since(tmp_path, monkeypatch):
    """The preflight checks the families configured before any work (every expensive job waits for it); the
    check the pick reads starts no second server for the same question, and one for a family added later."""
    server = {"gpus": 0, "engine_check": True}
    eagle3 = {"served": True, "seconds": 40.0, "drafts": 15, "error": None, "key": ec.key("eagle3", {}, server)}
    dflash = {"served": True, "seconds": 41.0, "drafts": 9, "error": None}
    written = json.loads(run_adapter(tmp_path / "a", monkeypatch, {"dflash": dflash}, earlier={"eagle3": eagle3},
                                     families=["eagle3", "dflash"]).read_text())
    assert run_adapter.asked == ["dflash"] and written["eagle3"] == eagle3 and written["dflash"]["drafts"] == 9
    # the same family checked with other server flags is checked again
    stale = {**eagle3, "key": ec.key("eagle3", {}, {**server, "extra_args": ["--max-num-seqs", "8"]})}
    run_adapter(tmp_path / "b", monkeypatch, {"eagle3": eagle3}, earlier={"eagle3": stale})
    assert run_adapter.asked == ["eagle3"]


def test_every_expensive_job_waits_for_the_engine_check_on_every_executor(tmp_path):
    """Under the SLURM profile (jobs: 50) generation and extraction were submitted beside the engine check,
    which only the pick read: a pair the engine cannot serve was found after hours of work there. The check
    of the configured families runs in the preflight, an input of every expensive job; the DAG with the
    profile's settings shows it."""
    import subprocess

    from tests.conftest import REPO

    dag = subprocess.run([str(REPO / ".venv" / "bin" / "snakemake"), "--profile", "profiles/slurm", "-n", "--dag",
                          "--forceall"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert dag.returncode == 0, dag.stderr[-3000:]
    labels = dict(re.findall(r'^\s*(\d+)\[label = "(\w+)', dag.stdout, re.M))
    edges = {(labels[a], labels[b]) for a, b in re.findall(r"^\s*(\d+) -> (\d+)", dag.stdout, re.M)}
    assert {("preflight", rule) for rule in ("generate", "hidden_states", "engine_check")} <= edges, edges
    upstream = {rule: {a for a, b in edges if b == rule} for rule in labels.values()}
    assert "preflight" in upstream["generate"] and "hidden_states" in upstream["train"]


def test_the_preflight_job_checks_the_configured_families_and_keeps_its_verdicts(tmp_path, monkeypatch):
    """What the preflight job runs (preflight.check): every problem, then the engine check of each configured
    family, its verdicts kept for the check the pick reads; a pair the engine cannot serve fails it."""
    from draftsmith.config.load import load_layers, validate_config
    from draftsmith.config.target import resolve
    from draftsmith.ops import preflight
    from tests.conftest import REPO
    from tests.test_config import DEFAULT

    monkeypatch.chdir(tmp_path)
    cfg = validate_config(load_layers([DEFAULT], {"train": {"families": ["eagle3", "dflash"]}}))
    asked = []

    def check(target_dir, families, *args, **kwargs):
        asked.append(families)
        return {f: {"served": f == "eagle3", "seconds": 1.0, "drafts": 3 if f == "eagle3" else None,
                    "error": None if f == "eagle3" else "ValueError: no"} for f in families}

    monkeypatch.setattr(ec, "check", check)
    monkeypatch.setattr("draftsmith.config.target.config_path", lambda target: tmp_path / "config.json")
    with pytest.raises(ValueError, match=r"cannot serve target .* with a drafter of family dflash"):
        preflight.check(cfg, resolve(cfg["target"], REPO), REPO, None)
    assert asked == [["eagle3", "dflash"]] and not ec.BEFORE_WORK.exists()
    cfg["train"]["families"] = ["eagle3"]
    preflight.check(cfg, resolve(cfg["target"], REPO), REPO, None)
    assert json.loads(ec.BEFORE_WORK.read_text())["eagle3"]["served"] is True
    cfg["server"]["engine_check"] = False
    preflight.check(cfg, resolve(cfg["target"], REPO), REPO, None)
    assert len(asked) == 2  # switched off: no server


def test_the_preflights_engine_check_runs_on_gpus_leased_for_it(tmp_path, monkeypatch):
    """On a machine whose GPUs jobs lease (the local executor beside other jobs and users), the preflight's
    servers started on GPUs it had not leased: another job's, out of memory, read as the family not served."""
    import torch

    from draftsmith.config.load import load_layers, validate_config
    from draftsmith.config.target import resolve
    from draftsmith.ops import devices, preflight
    from tests.conftest import REPO
    from tests.test_config import DEFAULT

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    monkeypatch.setattr(devices, "LEASES", tmp_path / "leases")
    monkeypatch.setattr(torch.version, "cuda", "13.0")  # the GPU stack's torch, which the preflight asks for
    cfg = validate_config(load_layers([DEFAULT], {"server": {"gpus": 2}, "train": {"gpus": 2}}))
    seen = []
    with devices.lease(1, ["0", "1", "2", "3"], tmp_path / "leases") as theirs:  # another job holds one
        monkeypatch.setattr(ec, "before_work", lambda *a: seen.append(os.environ["CUDA_VISIBLE_DEVICES"]))
        preflight.check(cfg, resolve(cfg["target"], REPO), REPO, None)
    assert len(seen[0].split(",")) == 2 and theirs[0] not in seen[0].split(","), (seen, theirs)


def server_config() -> dict:
    from draftsmith.config.load import validate_config

    server = validate_config({"target": {"name": "t", "source": "x"}, "datasets": {"a": {"source": "a.jsonl"}},
                              "evaluation": {"prompt_sets": {"b": {"source": "b.jsonl"}}}})["server"]
    return {**server, "max_model_len": 512, "env": {"VLLM_CPU_KVCACHE_SPACE": 1}}


@pytest.mark.e2e
@pytest.mark.parametrize("arch, families", [("qwen3", ["eagle3", "dflash"]), ("deepseek_v3", ["eagle3"])])
def test_vllm_gives_a_verdict_on_each_family_for_a_tiny_targets_twin(arch, families, tmp_path):
    """One vLLM-CPU start per family (~40-50 s each on 2 cores)."""
    target = build(arch, tmp_path / "target")
    results = ec.check(target, families, server_config(), tmp_path / "work", tmp_path / "logs")
    print(arch, json.dumps(results))  # the verdicts and times, with pytest -s
    assert list(results) == families
    for family, verdict in results.items():
        assert verdict["seconds"] > 0 and (tmp_path / "logs" / f"{family}.server.log").is_file()
        if verdict["served"]:
            assert verdict["drafts"] > 0 and verdict["error"] is None, (family, verdict)
        else:
            assert verdict["served"] is False and verdict["error"], (family, verdict)
    assert not list((tmp_path / "work" / "twin").glob("*.safetensors"))  # started without weights


def test_a_family_added_to_a_trained_project_is_engine_checked_before_it_trains(tmp_path):
    """The preflight checks the families configured when a run starts; a family added to a finished run trained
    before any check of it (the check the pick reads waits for nothing). Each family's training now waits for its
    own check; a family trained before the check existed gets none as a new input (it would rerun its training)."""
    import shutil
    import subprocess
    import sys

    from tests.conftest import REPO

    for name in ("Snakefile", "rules", "scripts", "config", "report"):
        (shutil.copytree if (REPO / name).is_dir() else shutil.copy)(REPO / name, tmp_path / name)
    trained = tmp_path / "results" / "train" / "eagle3" / "training.json"
    trained.parent.mkdir(parents=True)
    trained.write_text("{}")
    dag = subprocess.run([sys.executable, "-m", "snakemake", "-d", str(tmp_path), "--cores", "1", "-n", "--dag", "dot",
                          "--config", 'train={"families": ["eagle3", "dflash"]}', "--",
                          "results/train/eagle3/training.json", "results/train/dflash/training.json"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert dag.returncode == 0, dag.stderr[-3000:]
    found = re.findall(r'^\s*(\d+)\[label = "([^"]+)"', dag.stdout, re.M)
    labels = {n: label.replace("\\n", " ") for n, label in found}
    checks = {n: label for n, label in labels.items() if label.startswith("engine_check_family")}
    assert list(checks.values()) == ["engine_check_family family: dflash"], labels
    (check,) = checks
    assert any(labels[b].startswith("train") for a, b in re.findall(r"^\s*(\d+) -> (\d+)", dag.stdout, re.M)
               if a == check), dag.stdout


def test_a_family_checked_before_its_training_reuses_the_preflights_verdict_and_keeps_its_own(tmp_path, monkeypatch):
    """scripts/engine_check_family.py as Snakemake runs it: a family the preflight checked starts no server; an
    added one does, once, and its verdict joins the preflight's, where the check the pick reads finds it."""
    import runpy
    import sys
    from types import SimpleNamespace

    from tests.conftest import REPO

    monkeypatch.setattr(sys, "stderr", sys.stderr)  # run() points stderr at the job's log
    asked = []
    monkeypatch.setattr(ec, "check", lambda target_dir, todo, *a, **k: asked.extend(todo) or {
        f: {"served": True, "seconds": 41.0, "drafts": 9, "error": None} for f in todo})
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(config_of("qwen3").to_dict()))
    monkeypatch.chdir(tmp_path)
    server = {"gpus": 0, "engine_check": True}
    eagle3 = {"served": True, "seconds": 40.0, "drafts": 15, "error": None, "key": ec.key("eagle3", {}, server)}
    ec.BEFORE_WORK.parent.mkdir(parents=True)
    ec.BEFORE_WORK.write_text(json.dumps({"eagle3": eagle3}))

    def checked(family: str) -> dict:
        out = tmp_path / "results" / "checks" / "engine.cpu" / f"{family}.json"
        sm = SimpleNamespace(config={"target": {"name": "tiny", "source": str(target)}, "server": server,
                                     "train": {}},
                             wildcards=SimpleNamespace(family=family), output=[str(out)],
                             log=[str(tmp_path / "logs" / f"{family}.log")], threads=1,
                             resources=SimpleNamespace(gpu=0), scriptdir=str(REPO / "scripts"))
        (tmp_path / "logs").mkdir(exist_ok=True)
        runpy.run_path(str(REPO / "scripts" / "engine_check_family.py"), init_globals={"snakemake": sm},
                       run_name="__main__")
        return json.loads(out.read_text())

    assert checked("eagle3") == {"eagle3": eagle3} and asked == []
    assert checked("dflash")["dflash"]["drafts"] == 9 and asked == ["dflash"]
    kept = json.loads(ec.BEFORE_WORK.read_text())
    assert kept["eagle3"] == eagle3 and kept["dflash"]["key"] == ec.key("dflash", {}, server)
    checked("dflash")
    assert asked == ["dflash"]  # checked once
