"""Load the SGLang export with SGLang's own model class, on a CPU: no re-implementation in between.

Builds ``LlamaForCausalLMEagle3`` (``sglang/srt/models/llama_eagle3.py``) from the export's
``config.json`` in a single-process gloo group, fills every parameter with NaN, then calls SGLang's
own ``load_weights`` with the export's tensors and reports which parameters it filled, their shapes
as SGLang builds them, and the hot-token map it derived from ``d2t``. SGLang serves only on a GPU;
building the model on a CPU needs one stub: its rotary embedding imports vLLM's kernel module at
construction (nothing here runs a forward pass).

Runs in SGLang's own environment (``benchmarks/sglang_load.sh`` builds it): not part of CI.

    benchmarks/sglang_load.sh [results/drafter/sglang]
"""

from __future__ import annotations

import argparse
import json
import sys
import types
from pathlib import Path


def build(config_path: Path):
    sys.modules.setdefault("vllm", types.ModuleType("vllm"))
    ops = types.ModuleType("vllm._custom_ops")
    ops.rotary_embedding = None
    sys.modules.setdefault("vllm._custom_ops", ops)
    from sglang.test.layer_ut_utils import init_single_process_dist
    from transformers import LlamaConfig

    init_single_process_dist()
    from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3

    raw = json.loads(config_path.read_text())
    config = LlamaConfig.from_dict(raw)
    config.draft_vocab_size = raw["draft_vocab_size"]
    return LlamaForCausalLMEagle3(config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export", type=Path, nargs="?", default=Path("results/drafter/sglang"))
    args = parser.parse_args()
    import torch
    from safetensors.torch import load_file

    model = build(args.export / "config.json")
    with torch.no_grad():
        for param in model.parameters():
            param.fill_(float("nan"))
    weights = load_file(str(next(args.export.glob("*.safetensors"))))
    model.load_weights(weights.items())
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    empty = [n for n, p in model.named_parameters() if torch.isnan(p).any()]
    print(f"SGLang {__import__('sglang').__version__} LlamaForCausalLMEagle3 built with {len(shapes)} parameters:")
    for name, shape in shapes.items():
        print(f"  {name} {shape}{'  NOT FILLED' if name in empty else ''}")
    hot = model.get_hot_token_id()
    print(f"hot_token_id from d2t: {None if hot is None else tuple(hot.shape)}")
    # The draft embedding is the target's own at serving time (SGLang shares it), so the export has none.
    unfilled = [n for n in empty if n != "model.embed_tokens.weight"]
    if unfilled or hot is None:
        raise SystemExit(f"sglang_load: FAILED: not filled {unfilled}, "
                         f"hot_token_id {'missing' if hot is None else 'ok'}")
    print(f"sglang_load: every parameter {'but the shared embedding ' if empty else ''}filled by SGLang's own "
          f"load_weights, shapes as SGLang builds them")


if __name__ == "__main__":
    main()
