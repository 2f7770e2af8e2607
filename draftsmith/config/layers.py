"""Which of the target's layers feed the drafter (EAGLE-3's three auxiliary layers): decided here
once, for extraction, training and the checks before work. No heavy imports: the Snakefile's
preflight calls it while building the DAG."""

from __future__ import annotations

import json
from pathlib import Path


def default_aux_layers(num_layers: int) -> list[int]:
    """EAGLE-3's usual choice, ``[2, N/2, N-3]``: an early, a middle and a late layer. Below 7
    layers that repeats or reverses layers (a 4-layer target gets [2, 2, 1], which training
    refuses), so shallow targets get layers 1, N/2 and N-1 instead. Never layer 0 (the
    embeddings): vLLM's DeepSeek-V3 model cannot capture it (it adds a residual that is None)."""
    layers = [2, num_layers // 2, num_layers - 3]
    if layers == sorted(set(layers)):
        return layers
    if num_layers < 4:
        raise ValueError(f"EAGLE-3 needs three distinct auxiliary layers after the first; the target has "
                         f"{num_layers} layers")
    return [1, num_layers // 2, num_layers - 1]


def aux_layer_problem(layers: list[int], num_layers: int) -> str | None:
    """Why training would refuse these auxiliary layers, or None: they must be distinct target
    layers (ids 0 to N-1)."""
    if len(set(layers)) != len(layers):
        return f"{layers} repeats a layer"
    if max(layers) >= num_layers:
        return f"{layers}: the target has {num_layers} layers (ids 0 to {num_layers - 1})"
    return None


def choose_aux_layers(configured: list[int] | None, num_layers: int, pretrained_check: Path | None) -> list[int]:
    """The one place the layers are decided: configured, else the warm-start drafter's, else EAGLE-3's."""
    if configured:
        return list(configured)
    if pretrained_check is not None:
        return list(json.loads(pretrained_check.read_text())["aux_layers"])
    return default_aux_layers(num_layers)
