"""Tiny random-weight targets of the families users bring, built with transformers' own config
classes (no hub): Qwen3 dense, Qwen3-MoE and DeepSeek-V3 (MLA + MoE, the Kimi-K2 family), each
with a real Qwen3-family tokenizer and Qwen3's thinking template (vocabulary 151,936), fetched by
envs/test-assets.sh. Four layers: EAGLE-3's default layers [2, N/2, N-3] do not fit them."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import REPO

QWEN3_TOKENIZER = REPO / ".venv" / "share" / "draftsmith-test-assets" / "qwen3-tokenizer"
VOCAB = 151936
ARCHITECTURES = ("qwen3", "qwen3_moe", "deepseek_v3")
COMMON = {"vocab_size": VOCAB, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4,
          "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 4096,
          "tie_word_embeddings": False, "bos_token_id": 151643, "eos_token_id": 151645}


def config_of(arch: str):
    import transformers

    if arch == "qwen3":
        return transformers.Qwen3Config(**COMMON, head_dim=64)
    if arch == "qwen3_moe":
        return transformers.Qwen3MoeConfig(**COMMON, head_dim=64, num_experts=4, num_experts_per_tok=2,
                                           moe_intermediate_size=64, decoder_sparse_step=1, mlp_only_layers=[])
    if arch == "deepseek_v3":
        # MLA at DeepSeek-V3's own latent sizes (512 + 64): vLLM's CPU build serves no other. The
        # router as DeepSeek-V3's and Kimi-K2's config.json say (vLLM loads the bias only for it).
        return transformers.DeepseekV3Config(**COMMON, kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64,
                                             qk_nope_head_dim=64, v_head_dim=64, n_routed_experts=4,
                                             num_experts_per_tok=2, first_k_dense_replace=1, n_group=1,
                                             topk_group=1, n_shared_experts=1, moe_intermediate_size=64,
                                             topk_method="noaux_tc", scoring_func="sigmoid")
    raise ValueError(f"unknown architecture {arch!r}")


def build(arch: str, dest: Path, seed: int = 0) -> Path:
    """Write a loadable target folder (bf16 weights, config, tokenizer) to ``dest``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (QWEN3_TOKENIZER / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{QWEN3_TOKENIZER} is missing: run envs/test-assets.sh (test.sh does)")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config_of(arch), dtype=torch.bfloat16)
    model.save_pretrained(dest)
    AutoTokenizer.from_pretrained(QWEN3_TOKENIZER).save_pretrained(dest)
    return dest
