"""The serving methods the evaluation measures side by side: the drafter families this run trains, and
training-free speculation that needs no data run at all.

- **Trained** (:mod:`draftsmith.training.families`): EAGLE-3 drafts a chain of ``k`` tokens, each ``k``
  of ``evaluation.num_speculative_tokens`` a cell of its own; a DFlash or DSpark drafter drafts its
  trained block (its length is fixed at training).
- **Training-free** (``evaluation.training_free``): vLLM's n-gram prompt lookup (``ngram``: a draft where
  the last tokens occurred before in the prompt or the answer) and suffix decoding (``suffix``: a
  suffix tree of the prompt and the answer so far, from the ``arctic-inference`` package; its tree of
  earlier answers is off, :data:`SUFFIX_MEASURED`),
  at the same draft lengths as EAGLE-3. Their τ is tokens per target step over all steps: they
  propose only where a match is found, so a step without a draft counts as 1.

One owner of which method is which, what vLLM is told to serve it, and whether it can be served here.
"""

from __future__ import annotations

import importlib.util
import json
import shlex

from draftsmith.config.load import redacted_args
from draftsmith.data.datasets import environment_rows_params
from draftsmith.generation.server import ServerSpec, engine_args
from draftsmith.training import families

TRAINING_FREE = ("ngram", "suffix")
PLAIN = "plain"  # plain serving, the target alone: a setting of the serving ranking, never a served method
DISPLAY_NAME = {**families.DISPLAY_NAME, "ngram": "n-gram", "suffix": "suffix decoding",
                PLAIN: "plain serving (no speculation)"}
# arctic-inference 0.3.0 builds its suffix tree (C++) at install; vLLM 0.32 imports it for method "suffix"
# and checks no version. Its own vLLM plugin stays off unless ARCTIC_INFERENCE_ENABLED is set (it
# targets vLLM 0.26 on CUDA): leave that unset.
SUFFIX_PACKAGE = "arctic_inference"
SUFFIX_PIN = "arctic-inference==0.3.0"


# The drafter's folder as every served command names it (the card's commands; serving.json's config, written by
# scripts/evaluate_schedule.py with the same "." of its own, kept there so that no finished project measures its
# schedule again): the commands run from inside it.
DRAFTER_HERE = "."


def served_flags(server: dict, trust_remote_code: bool, tools: dict | None = None) -> list[str]:
    """The vLLM flags every measurement served the target with, as a user's ``vllm serve`` takes them
    (:meth:`~draftsmith.generation.server.ServerSpec.served_flags`): ``server``'s context and vLLM flags, the
    target's own code, and its tool-call parser where a prompt set was measured with tools (``tools``:
    :func:`draftsmith.data.datasets.tool_params`; tools rendered as text reach no parser)."""
    tools = tools or {}
    parser = tools.get("tool_call_parser") if tools.get("tool_rendering", "template") != "text" else None
    return redacted_args(ServerSpec(model="", max_model_len=server.get("max_model_len"),
                                    extra_args=engine_args(server, "vllm"), trust_remote_code=trust_remote_code,
                                    tool_call_parser=parser).served_flags())  # published: no secret flag's value


def served_command(model: str, config: dict | None, flags: list[str]) -> str:
    """The one way a served setting is written as a command (the card's and ``serving.json``'s): ``vllm serve``
    of the target ``model`` with ``config`` as its ``--speculative-config`` (None: plain serving) and the
    measurement's engine ``flags`` (:func:`served_flags`)."""
    spec = ["--speculative-config", json.dumps(config)] if config else []
    return shlex.join(["vllm", "serve", model, *spec, *flags])


# Methods whose first k drafts at a longer draft length are the drafts at k (EAGLE-3's chain, n-gram's and suffix
# decoding's continuation of a match): at T=0 their acceptance by position at the longest k measured says what
# each shorter k would accept (a block family drafts its whole block at once).
CHAINS = (families.DEFAULT_FAMILY, *TRAINING_FREE)


def is_trained(method: str) -> bool:
    return method in families.VLLM_METHOD


def draft_lengths(method: str, evaluation: dict, drafter_config: dict | None = None) -> list[int]:
    """The draft lengths ``method`` is measured at: EAGLE-3's and a training-free method's are
    ``evaluation.num_speculative_tokens``; a block family drafts its trained block (``drafter_config``,
    the exported config.json)."""
    if method == families.DEFAULT_FAMILY or not is_trained(method):
        return list(evaluation["num_speculative_tokens"])
    return [families.num_speculative_tokens(method, drafter_config, 0)]


def measured_training_free(evaluation: dict) -> list[str]:
    """The training-free methods measured: ``evaluation.training_free``, with vLLM's own methods; none
    where the evaluation engine is SGLang (said before any work: :func:`engine_notice`)."""
    return [] if evaluation["engine"] == "sglang" else list(evaluation["training_free"])


def engine_notice(evaluation: dict) -> str | None:
    if evaluation["engine"] == "sglang" and evaluation["training_free"]:
        return (f"evaluation.training_free {evaluation['training_free']}: vLLM's own methods, not measured with "
                "evaluation.engine sglang")
    return None


def servers(method: str, evaluation: dict, warm_start: bool) -> int:
    """Server starts of ``method``'s measurement: the target alone, then one per draft length and drafter
    (EAGLE-3's warm start measures the published drafter beside the finetuned one); a block family
    drafts one length, its block."""
    lengths = 1 if is_trained(method) and method != families.DEFAULT_FAMILY else len(
        evaluation["num_speculative_tokens"])
    return 1 + lengths * (2 if method == families.DEFAULT_FAMILY and warm_start else 1)


# Suffix decoding also drafts from a tree of the server's earlier answers (10,000 by default). The grid sends
# each prompt once per temperature and concurrency, after a warm-up with the same prompts: at T=0 that tree
# holds the very answer being measured (on the demo, τ 3.36 of at most 4 on HumanEval at k=3, T=0).
# So it is measured, and recommended, with that tree off: what a request drafts from its own prompt and
# answer so far.
SUFFIX_MEASURED = {"suffix_decoding_max_cached_requests": 0}


def speculative_config(method: str, k: int, evaluation: dict, drafter: str | None = None) -> dict:
    """vLLM's ``--speculative-config`` for ``method`` drafting ``k`` tokens per step (a trained method's
    folder in ``drafter``)."""
    if is_trained(method):
        return {"method": families.VLLM_METHOD[method], "model": drafter, "num_speculative_tokens": k}
    if method == "ngram":
        ngram = evaluation["ngram"]
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": ngram["prompt_lookup_min"],
                "prompt_lookup_max": ngram["prompt_lookup_max"]}
    if method == "suffix":
        return {"method": "suffix", "num_speculative_tokens": k, **SUFFIX_MEASURED}
    raise ValueError(f"unknown serving method {method!r}")


# What every method's measurement depends on (the grid); each method adds its own settings, and the pick's
# own keys (pick_by, pick_at, training_free) enter no measurement.
GRID_KEYS = ("engine", "prompt_sets", "max_tokens", "temperatures", "concurrency")


def grid_settings(evaluation: dict, tools: dict | None = None) -> dict:
    """The evaluation settings every measurement depends on: the target alone's (``rule evaluate_baseline``)
    and a schedule's (``rule evaluate_schedule``, whose ranges come from the pick). A set's ``workload`` is
    a label that no measurement depends on: left out, so that labelling a set remeasures nothing; a BFCL multi-turn
    set's rows run live since :data:`~draftsmith.data.datasets.ENVIRONMENT_ROWS_FORMAT`, named so that its windows
    are measured again once. ``tools``:
    how a tool set's tools reach the target (:func:`draftsmith.data.datasets.tool_params`), where set."""
    settings = {key: evaluation[key] for key in GRID_KEYS}
    settings["prompt_sets"] = {name: {k: v for k, v in entry.items() if k != "workload"}
                               | environment_rows_params(entry) for name, entry in evaluation["prompt_sets"].items()}
    return settings | ({"tools": tools} if tools else {})


def measurement_settings(method: str, evaluation: dict, tools: dict | None = None) -> dict:
    """The evaluation settings ``method``'s measurement depends on (its job's params: a change reruns that
    method alone): the grid, its draft lengths (EAGLE-3 and the training-free methods; a block family
    drafts its trained block) and how it is served."""
    own = grid_settings(evaluation, tools)
    if method == families.DEFAULT_FAMILY or method in TRAINING_FREE:
        own["num_speculative_tokens"] = evaluation["num_speculative_tokens"]
    if method == "ngram":
        own["ngram"] = evaluation["ngram"]
    if method == "suffix":  # a measurement made with its tree of earlier answers is measured again
        own["suffix"] = SUFFIX_MEASURED
    return own


def not_measured(method: str, on_gpus: bool, gate: dict | None) -> dict:
    """Why a trained family is not measured (``{"not_served": why}`` where the engine here cannot serve it,
    ``{"failed": verdict}`` where its export or gate failed), or ``{}``. A failed family is left out of
    the pick with its reason; the others' pick stands."""
    if not is_trained(method):
        return {}
    unserved = families.not_served_here(method, on_gpus=on_gpus)
    if unserved:
        return {"not_served": unserved}
    if gate and gate.get("passed") is False:
        return {"failed": gate["verdict"]}
    if gate and gate.get("served") is False:  # the export found the engine here would serve it wrong
        return {"not_served": gate["verdict"]}
    return {}


def unavailable(method: str) -> str | None:
    """Why ``method`` cannot be served with the installed packages, or None (said before any work)."""
    if method == "suffix" and importlib.util.find_spec(SUFFIX_PACKAGE) is None:
        return (f"suffix decoding needs the {SUFFIX_PACKAGE} package, which this environment lacks (vLLM 0.32 "
                f"fails with 'Arctic Inference is required for suffix decoding'): install {SUFFIX_PIN} "
                "(envs/requirements-*.txt pin it; it compiles a small C++ extension at install), and leave "
                "ARCTIC_INFERENCE_ENABLED unset")
    return None
