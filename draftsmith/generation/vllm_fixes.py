"""Fixes draftsmith brings into vLLM's own processes, as a ``vllm.general_plugins`` entry point.

vLLM loads its general plugins in every process it starts (API server, engine core, workers); that is
the one way to reach code that runs in a worker. Each fix applies only where its fault exists, so the
plugin does nothing on an accelerator.

Fixes (each a function here, replacing the vLLM attribute of the same name):

- :func:`expand_batch_to_tokens` (CPU only). vLLM 0.32's CPU stand-in for the Triton ``expand_kernel``
  fills an int64 copy of its output and drops it (vllm-project/vllm#55005), so ``expand_batch_to_tokens``
  returns uninitialised memory, which the rejection sampler divides the target's logits by as each
  draft token's temperature. At T > 0 with a drafter those logits become inf/NaN: no draft is accepted
  and the served text is noise. Greedy requests never take that path.
- :func:`normalize_context_k` (CPU only). A DFlash drafter normalises every draft layer's context keys in
  one ``ops.rms_norm`` call with a ``[layers, head_dim]`` weight; vLLM 0.32's CPU kernel applies layer 0's
  row to every layer (fixed for XPU in vllm-project/vllm#56431), so a drafter of more than one layer is
  served with the wrong keys: it drafts badly and no error says why.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

# Under vLLM's logger, so the line lands in the server's log with vLLM's own.
log = logging.getLogger("vllm.draftsmith")


def expand_batch_to_tokens(x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int,
                           replace_from: int = 0, replace_to: int = 0) -> torch.Tensor:
    """vLLM's ``expand_batch_to_tokens`` in torch: each request's value repeated over its draft tokens
    (``cu_num_tokens`` is the running count), ``replace_from`` swapped for ``replace_to`` (a greedy
    request's temperature 0 read as 1)."""
    counts = torch.diff(cu_num_tokens.long(), prepend=torch.zeros(1, dtype=torch.long))
    expanded = torch.repeat_interleave(x, counts, output_size=num_tokens)
    return expanded.masked_fill(expanded == replace_from, replace_to)


def normalize_context_k(self, all_k: torch.Tensor) -> torch.Tensor:
    """DFlash's grouped RMSNorm of every draft layer's context keys (``all_k``: ``[layers, tokens, kv heads,
    head_dim]``), each layer with its own weight row of ``self._k_norm_weights`` (``[layers, head_dim]``)."""
    x = all_k.float()
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self._rms_norm_eps)
    weights = self._k_norm_weights.float().view(all_k.shape[0], *([1] * (all_k.dim() - 2)), -1)
    return (normed * weights).to(all_k.dtype)


@dataclass(frozen=True)
class Mend:
    """One replacement: ``attribute`` of ``owner`` (a dotted path in ``module``), whose work is reached
    through ``caller`` (the vLLM function whose source must still call it, or the replacement would
    silently stop acting), replaced by ``replacement``."""

    name: str
    module: str
    owner: str | None  # a class in ``module``; None: the attribute is the module's own
    attribute: str
    caller: str  # dotted path in ``module`` of the function that calls ``attribute``
    replacement: Callable


DFLASH_KEYS = "DFlash context keys normalised per layer (as vllm#56431 for XPU)"
MENDS = (
    Mend("speculative sampling reads each request's temperature (vllm#55005)", "vllm.v1.sample.rejection_sampler",
         None, "expand_batch_to_tokens", "apply_sampling_constraints", expand_batch_to_tokens),
    Mend(DFLASH_KEYS, "vllm.model_executor.models.qwen3_dflash", "DFlashQwen3Model", "_normalize_context_k",
         "DFlashQwen3Model.precompute_and_store_context_kv", normalize_context_k),
)


def _resolve(root, dotted: str):
    for part in dotted.split("."):
        root = getattr(root, part)
    return root


def why_not(mend: Mend) -> str | None:
    """Why ``mend`` cannot act in the installed vLLM (a module moved, an attribute renamed, a call
    inlined), or None."""
    try:
        module = importlib.import_module(mend.module)
        owner = _resolve(module, mend.owner) if mend.owner else module
        getattr(owner, mend.attribute)
        caller = inspect.getsource(_resolve(module, mend.caller))
    except (ImportError, AttributeError, OSError, TypeError) as err:
        return f"{mend.module} changed: {type(err).__name__}: {err}"
    call = f"self.{mend.attribute}(" if mend.owner else f"{mend.attribute}("
    if call not in caller:
        return f"{mend.module}.{mend.caller} no longer calls {mend.attribute}: the mend would not act"
    return None


def unmended() -> dict[str, str]:
    """The mends the installed vLLM does not take, by name, with why (on a CPU: their faults are served)."""
    return {mend.name: reason for mend in MENDS if (reason := why_not(mend))}


def unserved_here(family: str, drafter_config: dict, on_gpus: bool) -> str | None:
    """Why vLLM's CPU build would serve this drafter wrong here, or None: a DFlash drafter of more than one
    layer needs :func:`normalize_context_k`, which a vLLM that moved or inlined the code no longer takes.
    Its greedy answers would still be the target's (verification sees to that), so only this check can
    tell."""
    if on_gpus or family != "dflash" or drafter_config["transformer_layer_config"]["num_hidden_layers"] < 2:
        return None
    reason = unmended().get(DFLASH_KEYS)
    return reason and (f"vLLM's CPU build normalises every DFlash layer's context keys with layer 0's weight, and "
                       f"draftsmith's mend does not act on the installed vLLM ({reason}): not served here")


def register() -> None:
    """The entry point vLLM calls (once per process). A mend that cannot act is logged and left out,
    never raised: this plugin loads into every vLLM process, the target-alone servers included."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    for mend in MENDS:
        reason = why_not(mend)
        if reason:
            log.warning("draftsmith: not applied: %s: %s", mend.name, reason)
            continue
        module = importlib.import_module(mend.module)
        setattr(_resolve(module, mend.owner) if mend.owner else module, mend.attribute, mend.replacement)
        log.info("draftsmith: applied on this CPU: %s", mend.name)
