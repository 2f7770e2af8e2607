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

import logging

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


def register() -> None:
    """The entry point vLLM calls (once per process)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.model_executor.models import qwen3_dflash
    from vllm.v1.sample import rejection_sampler

    rejection_sampler.expand_batch_to_tokens = expand_batch_to_tokens
    qwen3_dflash.DFlashQwen3Model._normalize_context_k = normalize_context_k
    log.info("draftsmith: CPU speculative sampling reads each request's temperature (fix for vllm#55005); "
             "DFlash context keys are normalised per layer (as vllm#56431 for XPU)")
