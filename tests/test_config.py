import copy

import pytest
import yaml

from draftsmith.config import ConfigError, validate_config
from tests.conftest import REPO

MINIMAL = {"target": {"name": "t", "source": "x"}, "datasets": {"a": {"source": "a.jsonl"}},
           "benchmark": {"prompt_sets": {"b": {"source": "b.jsonl"}}}}


def test_defaults_are_filled_in_nested_dataset_entries():
    cfg = validate_config(MINIMAL)
    gen = cfg["datasets"]["a"]["generation"]
    assert gen["concurrency"] == 200 and gen["request_timeout_s"] == 1800 and gen["finish_reason_policy"] == "keep"
    assert cfg["datasets"]["a"]["format"] == "auto"
    assert cfg["generation_server"]["mode"] == "managed" and cfg["hidden_states"]["backend"] == "vllm"
    assert "generation" not in MINIMAL["datasets"]["a"]  # input left untouched


@pytest.mark.parametrize("path, value, expected", [
    (("target", "bogus"), 1, "target: unknown key(s) ('bogus' was unexpected)"),
    (("datasets", "a", "generation", "max_tokens"), "many", "datasets.a.generation.max_tokens: 'many' is not of type"),
    (("hidden_states",), {"backend": "sglang"}, "hidden_states.backend: 'sglang' is not one of"),
    (("datasets", "a", "max_samples"), 0, "datasets.a.max_samples: 0 is less than the minimum"),
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


@pytest.mark.parametrize("name", ["config/config.yaml", "tests/e2e/config.yaml"])
def test_shipped_configs_validate(name):
    validate_config(yaml.safe_load((REPO / name).read_text()))


def test_external_generation_needs_an_endpoint():
    with pytest.raises(ConfigError, match="generation_server.base_urls: \\[\\] should be non-empty"):
        validate_config({**MINIMAL, "generation_server": {"mode": "external"}})
    cfg = validate_config({**MINIMAL, "generation_server": {"mode": "external", "base_urls": ["https://x/v1"],
                                                             "api_key_env": "OPENROUTER_API_KEY"}})
    assert cfg["generation_server"]["engine"] == "vllm"


def test_key_order_does_not_change_the_validated_config():
    a = validate_config({"target": {"name": "t", "source": "x"}, "benchmark": {"prompt_sets": {"b": {"source": "b"}}},
                         "datasets": {"a": {"source": "a.jsonl", "generation": {"max_tokens": 5, "concurrency": 2}}}})
    b = validate_config({"datasets": {"a": {"generation": {"concurrency": 2, "max_tokens": 5}, "source": "a.jsonl"}},
                         "benchmark": {"prompt_sets": {"b": {"source": "b"}}}, "target": {"source": "x", "name": "t"}})
    assert repr(a) == repr(b)  # Snakemake compares params as text
