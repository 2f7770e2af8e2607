"""A target that ships its own modeling code (auto_map in config.json, as DeepSeek-V3 and
Kimi-K2.5 do): refused before work without target.trust_remote_code, loaded with it."""

from __future__ import annotations

import json

import pytest
import torch

from draftsmith.config.load import load_layers, validate_config
from draftsmith.config.target import facts, load_tokenizer, resolve
from draftsmith.hidden_states.extract import extract_transformers
from draftsmith.hidden_states.store import open_store
from draftsmith.ops import preflight
from tests.conftest import REPO

CONFIGURATION = '''from transformers import Qwen3Config


class TinyConfig(Qwen3Config):
    model_type = "tiny_custom"
'''
MODELING = '''from transformers import Qwen3ForCausalLM

from .configuration_tiny import TinyConfig


class TinyForCausalLM(Qwen3ForCausalLM):
    config_class = TinyConfig
'''


@pytest.fixture(scope="module")
def custom_target(tokenizer, tmp_path_factory):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    folder = tmp_path_factory.mktemp("custom")
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
                                         head_dim=32, max_position_embeddings=2048))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "configuration_tiny.py").write_text(CONFIGURATION)
    (folder / "modeling_tiny.py").write_text(MODELING)
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="tiny_custom", architectures=["TinyForCausalLM"],
                  auto_map={"AutoConfig": "configuration_tiny.TinyConfig",
                            "AutoModelForCausalLM": "modeling_tiny.TinyForCausalLM"})
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def config_for(folder, trust):
    return validate_config(load_layers([REPO / "config" / "config.yaml"], {"target": {
        "name": "custom", "source": str(folder), "trust_remote_code": trust}}))


def test_without_the_flag_the_target_is_refused_before_work_naming_it(custom_target):
    config = config_for(custom_target, False)
    target = resolve(config["target"], REPO)
    found = preflight.problems(config, target, REPO, facts(target))
    assert any("target.trust_remote_code: true" in p and "tiny_custom" in p for p in found), found
    assert not preflight.problems(config_for(custom_target, True), target, REPO, facts(target))


def test_with_the_flag_its_code_loads_for_tokenizing_and_extraction(custom_target, tmp_path):
    target = resolve(config_for(custom_target, True)["target"], REPO)
    assert target.trust_remote_code and load_tokenizer(target)("hello")["input_ids"]
    rows = [(0, [1, 2, 3, 4])]
    store = open_store(tmp_path / "hs", "fp", "per_row")
    with pytest.raises(ValueError, match="trust_remote_code"), store.writer() as writer:
        extract_transformers(target.model, rows, writer, [1, 2, 3], threads=1)  # as the backend was before
    with store.writer() as writer:
        extract_transformers(target.model, rows, writer, [1, 2, 3], threads=1,
                             trust_remote_code=target.trust_remote_code)
    assert store.read(0)["hidden_states"].shape == (4, 4, 64) and store.read(0)["token_ids"].dtype == torch.int64
