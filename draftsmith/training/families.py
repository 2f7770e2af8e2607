"""Drafter families trained from one hidden-state store: what each needs from the config, the trainer
and the engine. The one owner of these facts; rules, training, export, evaluation and the report ask here.

- **eagle3**: speculators' EAGLE-3 (a chain of ``evaluation.num_speculative_tokens`` drafts); the
  settings are ``train``'s own keys, as before families existed, so its run key is unchanged.
- **dflash**: a block of ``block_size`` positions drafted in parallel from the target's context
  features; vLLM drafts ``block_size - 1`` tokens (the first position is the verifier's bonus token).
- **dspark**: DFlash's backbone with a sequential Markov head and a confidence head. vLLM serves it
  only with its V2 model runner, which vLLM's CPU build does not use: on a CPU machine it is trained
  and exported, and marked "not served here".

All three read the same stored hidden states (``[seq, n_aux + 1, hidden]``) and the same vocabulary
mapping: a family added later trains alone.
"""

from __future__ import annotations

import re

DEFAULT_FAMILY = "eagle3"

# train keys every family shares (each block-drafting family may override epochs and lr).
SHARED_KEYS = ("epochs", "max_steps", "lr", "optimizer", "weight_decay", "scheduler", "warmup_steps", "warmup_ratio",
               "total_seq_len", "seed", "select")
BLOCK_FAMILIES = ("dflash", "dspark")

# The engine's name for each family (vLLM's speculative_config "method"), and the name people read.
VLLM_METHOD = {"eagle3": "eagle3", "dflash": "dflash", "dspark": "dspark"}
DISPLAY_NAME = {"eagle3": "EAGLE-3", "dflash": "DFlash", "dspark": "DSpark"}
# speculators' block size when none is configured (its schema: 16 for dflash, 8 otherwise), and its
# draft layers for a block family.
SPECULATORS_BLOCK_SIZE = {"dflash": 16, "dspark": 8}
SPECULATORS_LAYERS = 5
# speculators' loss when none is configured (its schema: cross-entropy for dflash, kl_div otherwise).
SPECULATORS_LOSS_FN = {"dflash": "ce"}
SPECULATORS_DEFAULT_LOSS_FN = "kl_div"


def settings(train: dict, family: str) -> dict:
    """The family's training settings: what its train job's params and run key are made of. For
    eagle3 that is ``train`` without the family list and blocks (the key before families existed); for
    a block family the shared keys with the block's non-null values over them."""
    if family == DEFAULT_FAMILY:
        return {k: v for k, v in train.items() if k not in ("families", *BLOCK_FAMILIES)}
    block = train[family]
    shared = {k: train[k] for k in SHARED_KEYS if k in train}
    return {**shared, **{k: v for k, v in block.items() if v is not None or k not in shared}, "family": family}


def loss_fn(cfg: dict) -> str:
    """The loss a family's settings train with: the configured one, else speculators' recipe for the
    family (what its parser resolves a missing ``--loss-fn`` to). The trainer's probe needs it by name."""
    family = cfg.get("family", DEFAULT_FAMILY)
    return cfg.get("loss_fn") or SPECULATORS_LOSS_FN.get(family, SPECULATORS_DEFAULT_LOSS_FN)


def num_speculative_tokens(family: str, trained_config: dict, evaluation_k: int) -> int:
    """Draft tokens per step when served: EAGLE-3's configured chain length; a block family drafts
    its trained block minus the anchor (vLLM's rule: ``block_size - 1`` without sampling from it)."""
    if family == DEFAULT_FAMILY:
        return evaluation_k
    size = trained_config["block_size"]
    return size if trained_config.get("sample_from_anchor") else size - 1


def not_served_here(family: str, on_gpus: bool) -> str | None:
    """Why the engine cannot serve ``family`` where the workflow serves (``server.gpus`` > 0: vLLM on
    GPUs; 0: vLLM's CPU build), or None."""
    if family == "dspark" and not on_gpus:
        return ("vLLM serves DSpark only with its V2 model runner, which its CPU build does not use: trained and "
                "exported here, not served or measured (a GPU machine measures it)")
    return None


# speculators' per-step validation accuracies: EAGLE-3's full_acc_k (the first k+1 drafted tokens all
# right), a block family's position_k_acc (position k of the block right). Both also log full_acc.
STEP_ACCURACY = (re.compile(r"full_acc_(\d+)_epoch"), re.compile(r"position_(\d+)_acc_epoch"))


def step_accuracies(metrics: dict) -> list[tuple[str, str]]:
    """The validation accuracies per draft step, in step order, as (metrics key, label)."""
    for pattern in STEP_ACCURACY:
        steps = sorted(int(m[1]) for key in metrics if (m := pattern.fullmatch(key)))
        if steps:
            keys = [pattern.pattern.replace(r"(\d+)", str(k)) for k in steps]
            return [(key, key.removesuffix("_epoch")) for key in keys]
    return []


def first_position_accuracy(metrics: dict) -> float | None:
    """The validation accuracy of the first drafted token (what the export gate compares the served
    first-position acceptance with): EAGLE-3's ``full_acc_0``, a block's first non-anchor position."""
    steps = step_accuracies(metrics)
    return metrics[steps[0][0]] if steps else None
