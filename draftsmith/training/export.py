"""Export a trained drafter for the engines that serve it, and check it there before calling it done.

- **vLLM**: speculators' own format (``config.json`` with ``speculators_config``, weights with
  ``d2t``/``t2d``), the verifier named by its hub id (or a relative path) so the folder moves. Every
  family (EAGLE-3, DFlash, DSpark); a block drafter whose attention vLLM would serve differently from
  its training is refused (:func:`attention_refusal`).
- **SGLang** (EAGLE-3 only): the layout SGLang's ``LlamaForCausalLMEagle3`` loads (and SpecForge writes): a
  ``LlamaConfig`` with ``draft_vocab_size`` and ``eagle_config.eagle_aux_hidden_state_layer_ids``,
  the decoder layer named ``midlayer.*``, ``d2t``/``t2d`` alongside. SGLang's layer is the
  original EAGLE-3 one: a drafter trained with speculators' extra norms (``norm_before_residual``,
  ``norm_before_fc``, ``norm_output``) or more than one layer computes something else there, so
  it is refused rather than exported wrong.
- **Gate**: vLLM loads the exported drafter and continues a few validation rows from their prompt
  tokens as their answers were generated (greedy: the target then writes the answers the drafter was
  validated on; sampled alike where they were sampled);
  the export fails when the drafter does not load, drafts nothing, or accepts far less than its
  validation accuracy says it should (the signature of a broken vocabulary mapping).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

from draftsmith.core.atomic import atomic_path, write_json

SGLANG_ARCHITECTURE = "LlamaForCausalLMEagle3"
UNSUPPORTED_BY_SGLANG = ("norm_before_residual", "norm_before_fc", "norm_output", "fc_norm")


class ExportRefused(ValueError):
    pass


def tensor_shapes(weights: Path) -> dict[str, list[int]]:
    from safetensors import safe_open

    with safe_open(weights, framework="pt") as fh:
        return {k: list(fh.get_slice(k).get_shape()) for k in fh.keys()}  # noqa: SIM118 - not a dict


# safetensors' floating-point dtypes: a drafter's parameters, which vLLM loads in the dtype it serves the target
# in; the rest (d2t, t2d: the draft vocabulary's maps) it loads as they are stored.
FLOAT_DTYPES = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}  # core.compute's dtypes


def drafter_size(weights: Path) -> dict:
    """A drafter's size as its safetensors file holds it, read from the file's header alone (no tensor is
    loaded): its ``parameters`` (floating-point elements), the ``other_bytes`` of its other tensors, and the
    ``file_bytes``."""
    with weights.open("rb") as fh:
        header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
    tensors = [t for name, t in header.items() if name != "__metadata__"]
    return {"parameters": sum(math.prod(t["shape"]) for t in tensors if t["dtype"] in FLOAT_DTYPES),
            "other_bytes": sum(t["data_offsets"][1] - t["data_offsets"][0] for t in tensors
                               if t["dtype"] not in FLOAT_DTYPES),
            "file_bytes": weights.stat().st_size}


def served_weight_bytes(size: dict, dtype: str) -> int:
    """The memory a drafter's weights take served in ``dtype`` (the target's): its parameters in that dtype and
    its other tensors as stored; not the KV cache of its draft layers, which vLLM takes from the target's."""
    return size["parameters"] * DTYPE_BYTES[dtype] + size["other_bytes"]


def check_drafter(weights: Path, config_path: Path) -> dict[str, list[int]]:
    """Refuse a checkpoint missing the tensors vLLM needs to map draft tokens (d2t/t2d) or fuse layers."""
    config = json.loads(config_path.read_text())
    hidden = config["transformer_layer_config"]["hidden_size"]
    target_hidden = config.get("target_hidden_size") or hidden
    shapes = tensor_shapes(weights)
    for key in ("d2t", "t2d", "fc.weight", "lm_head.weight"):
        if key not in shapes:
            raise ValueError(f"{weights}: drafter has no {key!r} tensor")
    if shapes["fc.weight"] != [hidden, 3 * target_hidden]:
        raise ValueError(f"{weights}: fc.weight is {shapes['fc.weight']}, expected [{hidden}, {3 * target_hidden}]")
    if shapes["d2t"][0] != shapes["lm_head.weight"][0]:
        raise ValueError(f"{weights}: d2t has {shapes['d2t'][0]} entries but lm_head has {shapes['lm_head.weight'][0]}")
    return shapes


def attention_refusal(config: dict) -> str | None:
    """Why vLLM would serve this block drafter with other attention than it was trained with, or None.
    speculators trains a full-attention draft layer bidirectionally inside each block; vLLM 0.32 serves
    every layer causally there (vllm-project/vllm PR 56692, open): the drafts would be computed from a
    mask the drafter never saw. Sliding-window layers carry their causality in the config, which vLLM reads."""
    layer_types = config.get("transformer_layer_config", {}).get("layer_types") or []
    full = [i for i, kind in enumerate(layer_types) if kind == "full_attention"]
    if config.get("speculators_model_type", "eagle3") != "eagle3" and full:
        return (f"draft layer(s) {full} use full attention, trained bidirectionally inside each block, which vLLM "
                "serves causally (vllm PR 56692); train every layer with sliding-window attention")
    return None


def export_vllm(checkpoint: Path, weights_out: Path, config_out: Path, verifier_ref: str) -> dict:
    """Copy the checkpoint to the drafter folder with a portable verifier reference, and check it."""
    check_drafter(checkpoint / "model.safetensors", checkpoint / "config.json")
    config = json.loads((checkpoint / "config.json").read_text())
    refusal = attention_refusal(config)
    if refusal:
        raise ExportRefused(f"{checkpoint}: not exported for vLLM: {refusal}")
    config["speculators_config"]["verifier"]["name_or_path"] = verifier_ref
    with atomic_path(weights_out) as tmp:
        shutil.copyfile(checkpoint / "model.safetensors", tmp)
    write_json(config_out, config)
    return config


def sglang_refusal(config: dict) -> str | None:
    """Why SGLang's LlamaForCausalLMEagle3 would not compute this drafter, or None."""
    family = config.get("speculators_model_type", "eagle3")
    if family != "eagle3":
        return f"a {family} drafter: the SGLang export here is EAGLE-3's layout ({SGLANG_ARCHITECTURE})"
    flags = [k for k in UNSUPPORTED_BY_SGLANG if config.get(k)]
    if flags:
        return (f"the drafter uses {', '.join(f'{k}=true' for k in flags)}, which SGLang's {SGLANG_ARCHITECTURE} "
                "does not implement (train with train.architecture: eagle3, or set export.sglang: false)")
    layer_type = config["transformer_layer_config"].get("model_type", "llama")
    if layer_type != "llama":
        return (f"the drafter's decoder layer is {layer_type} (train.draft_arch); SGLang's {SGLANG_ARCHITECTURE} "
                "is llama")
    layers = config["transformer_layer_config"]["num_hidden_layers"]
    if layers != 1:
        return f"the drafter has {layers} decoder layers; SGLang's {SGLANG_ARCHITECTURE} export here supports 1"
    return None


def sglang_config(config: dict) -> dict:
    """The LlamaConfig SGLang reads, from a speculators EAGLE-3 config."""
    layer = dict(config["transformer_layer_config"])
    rope = layer.pop("rope_parameters", None) or {}
    for key in ("layer_types", "sliding_window", "use_sliding_window", "auto_map"):
        layer.pop(key, None)
    out = {**layer, "architectures": [SGLANG_ARCHITECTURE], "model_type": "llama", "num_hidden_layers": 1,
           "tie_word_embeddings": False, "draft_vocab_size": config["draft_vocab_size"],
           "torch_dtype": config.get("dtype", "bfloat16"),
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": config["eagle_aux_hidden_state_layer_ids"],
                            "use_aux_hidden_state": True}}
    if rope:
        out["rope_theta"] = rope.get("rope_theta", 10000.0)
        if rope.get("rope_type", "default") != "default":
            out["rope_scaling"] = rope
    if config.get("target_hidden_size"):
        out["target_hidden_size"] = config["target_hidden_size"]
    return out


def sglang_name(name: str) -> str:
    return name.replace("layers.0.", "midlayer.", 1) if name.startswith("layers.0.") else name


def export_sglang(checkpoint: Path, out_dir: Path) -> dict:
    """Write ``out_dir`` (config.json + model.safetensors) in SGLang's EAGLE-3 layout."""
    from safetensors.torch import load_file, save_file

    config = json.loads((checkpoint / "config.json").read_text())
    refusal = sglang_refusal(config)
    if refusal:
        raise ExportRefused(f"{checkpoint}: no SGLang export: {refusal}")
    weights = {sglang_name(k): v for k, v in load_file(checkpoint / "model.safetensors").items()}
    with atomic_path(out_dir) as tmp:
        tmp.mkdir()
        save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(sglang_config(config), indent=2, sort_keys=True) + "\n")
    return {"tensors": sorted(weights)}


GATE_CHAIN = 3  # EAGLE-3's drafts per step at the gate (a block family drafts its trained block)
GATE_WINDOW = 64  # tokens of each answer the gate serves


def gate_window(gate: dict | None) -> int:
    """The tokens of each answer a gate served, as its record says (gates from before it was recorded: this
    window, which they served)."""
    return (gate or {}).get("window") or GATE_WINDOW


def gate_rows(merged: Path, count: int, samplings: dict[str, dict | None], max_tokens: int = GATE_WINDOW,
              skip: set[tuple[str, int]] = frozenset()) -> list[tuple[list[int], int, dict]]:
    """``(prompt token ids, tokens to generate, sampling)`` of the first validation rows (but ``skip``: ``(dataset,
    row)`` whose hidden states failed, which the gate's prediction cannot replay): the ids before the first
    supervised token, as many tokens as that first answer has (capped), and its dataset's answers' sampling
    where they were sampled (``samplings``; else greedy): the replay walks the answer as a server sampling
    alike would, so the server must sample alike."""
    from draftsmith.training.replay import GREEDY, held_out, sampled

    rows = []
    for entry in held_out(merged, skip, count):  # the rows the gate's prediction replays, in the same order
        ids, mask = entry["input_ids"], entry["loss_mask"]
        start = mask.index(1)
        end = next((i for i in range(start, len(mask)) if not mask[i]), len(mask))
        sampling = samplings.get(entry["dataset"])
        rows.append((ids[:start], min(end - start, max_tokens), sampling if sampled(sampling) else GREEDY))
    return rows


# A position whose served acceptance is below this share of the predicted one, or above ABOVE_SHARE of it, is
# flagged (not failed: the drafter is served, but the engine accepts otherwise than the same drafter, replayed,
# says it should; above it: the served text is not the replayed one, e.g. near-ties, another engine's answers),
# where the prediction accepts enough drafts there for a share to mean anything: below FLAG_MIN_ACCEPTED drafts
# predicted accepted at a position, no share of it is computed at all ("too few to judge").
PREDICTED_SHARE = 0.8
ABOVE_SHARE = 1.25
FLAG_MIN_ACCEPTED = 10
# Sampled answers make both sides samples: a gap within this many standard errors of their difference, with rows
# as the unit (:func:`rows_band`), is what samples of the same acceptance differ by.
SAMPLED_Z = 3.0
# The gate's default size (``export.gate_prompts``, ``export.gate_samples`` null). Greedy rows serve the stored
# answers again (no sampling band): GATE_ROWS of them find a broken mapping. At T > 0 the band at position 1 must
# be narrower than the tolerance, SAMPLED_Z standard errors within (1 - PREDICTED_SHARE) of the prediction p. Planned
# as if each side's per-row rate were binomial over PLAN_DRAFTS drafts at PLAN_ACCEPTANCE (the weakest first
# position the gate judges; rows as the unit make it no narrower), n rows with S served samples each need
#     n * S / (S + 1) >= PLANNED_ROWS = Z^2 (1 - p) / ((1 - PREDICTED_SHARE)^2 p d)   (= 42.2 at p 0.1, d 48)
# (the prediction walks one stored answer per row; the served side averages its S samples). The rows read
# after serving decide (:func:`gate_resolution`): a gate that cannot tell says so, and how many rows would.
GATE_ROWS = 8
GATE_ROWS_SAMPLED = 64
PLAN_ACCEPTANCE = 0.1
PLAN_DRAFTS = 48  # a 64-token window at about 1.3 tokens per step
PLANNED_ROWS = SAMPLED_Z ** 2 * (1 - PLAN_ACCEPTANCE) / ((1 - PREDICTED_SHARE) ** 2 * PLAN_ACCEPTANCE * PLAN_DRAFTS)
MAX_GATE_SAMPLES = 8


def gate_size(setting: int | None, sampled_rows: bool) -> int:
    """The validation rows the gate reads: ``export.gate_prompts``, else :data:`GATE_ROWS` (greedy answers) or
    :data:`GATE_ROWS_SAMPLED` (any sampled)."""
    return setting or (GATE_ROWS_SAMPLED if sampled_rows else GATE_ROWS)


def gate_samples(rows: int, setting: int | None, sampled_rows: bool) -> int:
    """Served samples per sampled row: ``export.gate_samples``, else the fewest with which ``rows`` rows meet
    :data:`PLANNED_ROWS` (at most :data:`MAX_GATE_SAMPLES`: fewer rows than that cannot, whatever the samples);
    1 where every row is greedy (served again, a greedy row reads the same)."""
    if setting:
        return setting
    if not sampled_rows:
        return 1
    return next((s for s in range(1, MAX_GATE_SAMPLES + 1) if rows * s / (s + 1) >= PLANNED_ROWS), MAX_GATE_SAMPLES)


def gate_requests(rows: list[tuple[list[int], int, dict]], samples: int,
                  seed: int) -> tuple[list[tuple[list[int], int, dict]], list[int]]:
    """The gate's requests and the row each serves: each sampled row ``samples`` times, each request with its own
    seed (``seed`` plus its index: vLLM seeds that request's own generator, so no two samples share a draw and a
    gate run's seed names its draws); greedy rows once, unseeded."""
    requests, of_row = [], []
    for i, (ids, max_tokens, sampling) in enumerate(rows):
        for _ in range(samples if sampling.get("temperature", 0) > 0 else 1):
            requests.append((ids, max_tokens, {**sampling, "seed": seed + len(requests)}
                             if sampling.get("temperature", 0) > 0 else sampling))
            of_row.append(i)
    return requests, of_row


def request_counts(response: dict) -> dict | None:
    """One completion's drafts and accepted drafts by position, from vLLM's per-request counts
    (``--per-request-spec-decode-metrics``: ``metrics.speculative_decoding``, whose ``acceptance_histogram[j]``
    counts the steps that accepted exactly ``j`` drafts: position ``i`` accepted at the steps that accepted ``i``
    or more, as the engine's per-position counters count); None where the response carries none."""
    counts = ((response.get("metrics") or {}).get("speculative_decoding") or {})
    histogram = counts.get("acceptance_histogram")
    if histogram is None:
        return None
    return {"drafts": sum(histogram),
            "accepted": [sum(histogram[i:]) for i in range(1, len(histogram))]}


def served_rows(responses: list[dict], of_row: list[int], rows: int) -> list[dict] | None:
    """Each gate row's served drafts and accepted drafts by position, summed over its samples; None where any
    response lacks its per-request counts (an engine without them: the band cannot be computed over rows)."""
    counts = [request_counts(r) for r in responses]
    if not counts or any(c is None for c in counts):
        return None
    out = [{"drafts": 0, "accepted": [0] * len(counts[0]["accepted"])} for _ in range(rows)]
    for row, count in zip(of_row, counts, strict=True):
        out[row]["drafts"] += count["drafts"]
        out[row]["accepted"] = [a + b for a, b in zip(out[row]["accepted"], count["accepted"], strict=True)]
    return out


def ratio_residuals(rows: list[dict], position: int) -> list[float]:
    """Each row's share of a ratio estimator's error at ``position`` (0-based): ``(a_i - r d_i) / sum d``, with
    ``r = sum a / sum d`` the pooled acceptance rate. The drafts of a row share its text (an easy row accepts
    most of them, a hard one few), so the row, not the draft, is the independent unit."""
    drafts = sum(r["drafts"] for r in rows)
    rate = sum(r["accepted"][position] for r in rows) / drafts
    return [(r["accepted"][position] - rate * r["drafts"]) / drafts for r in rows]


def rows_band(served: list[dict], predicted: list[dict], position: int) -> float | None:
    """The standard error of served minus predicted acceptance at ``position`` with rows as the unit: the two
    ratio estimators linearised over the same rows, paired (a row easy for the drafter is easy on both sides),
    ``sqrt(n / (n - 1) * sum_i (e_served_i - e_predicted_i)^2)``. None under two rows, or rows that differ."""
    if len(served) != len(predicted) or len(served) < 2 or not all(
            sum(r["drafts"] for r in side) for side in (served, predicted)):
        return None
    n = len(served)
    gaps = [s - p for s, p in zip(ratio_residuals(served, position), ratio_residuals(predicted, position),
                                  strict=True)]
    return (n / (n - 1) * sum(g * g for g in gaps)) ** 0.5


def off_prediction(served: float, predicted: float, count: float, spread: float = 0.0) -> str | bool | None:
    """Which way a served rate strays from its prediction: ``"below"``, ``"above"``, False within the band (or
    within :data:`SAMPLED_Z` of ``spread``, the standard error of their difference where both are samples),
    None where the prediction accepted too few drafts to judge."""
    if count < FLAG_MIN_ACCEPTED:
        return None
    if abs(served - predicted) <= SAMPLED_Z * spread:
        return False
    if served < PREDICTED_SHARE * predicted:
        return "below"
    return "above" if served > ABOVE_SHARE * predicted else False


def flag_thresholds() -> dict:
    """The thresholds :func:`off_prediction` flags a position by, recorded in gate.json beside the positions they
    flagged (``thresholds``), so that every page words the rule the gate applied."""
    return {"predicted_share": PREDICTED_SHARE, "above_share": ABOVE_SHARE, "flag_min_accepted": FLAG_MIN_ACCEPTED,
            "sampled_z": SAMPLED_Z}


def thresholds_of(gate: dict | None) -> dict:
    """The thresholds a gate flagged its positions by, as gate.json recorded them. Gates from before they were
    recorded: today's (:func:`flag_thresholds`), which they may not have applied."""
    return (gate or {}).get("thresholds") or flag_thresholds()


def flag_rule_text(thresholds: dict) -> str:
    """:func:`off_prediction`'s rule in words, from the ``thresholds`` a gate recorded (:func:`thresholds_of`)."""
    return (f"A position served below {thresholds['predicted_share']:g} or above {thresholds['above_share']:g} of "
            f"its prediction, where the prediction accepts {thresholds['flag_min_accepted']} drafts or more, is "
            "flagged")


def gate_resolution(positions: list[dict], rows: int, samples: int, seed: int | None,
                    served_per_row: bool) -> dict:
    """Whether a sampled gate can tell sampling from a fault at position 1: its band (:data:`SAMPLED_Z` standard
    errors over rows, :func:`rows_band`) narrower than the tolerance, ``(1 - PREDICTED_SHARE)`` of the
    prediction; if not, about how many rows would (the band shrinks as the square root of the rows), from the
    spread the rows showed. Worded by :func:`resolution_text`."""
    out = {"rows": rows, "samples": samples, "seed": seed, "can_tell": False}
    first = positions[0] if positions else None
    if not served_per_row:
        return {**out, "why": "no per-request counts"}
    if first is None or first["flag"] is None:
        return {**out, "why": "too few accepted"}
    if first["spread"] is None:
        return {**out, "why": "under two rows"}
    band, tolerance = SAMPLED_Z * first["spread"], (1 - PREDICTED_SHARE) * first["predicted"]
    out.update(band=band, tolerance=tolerance, can_tell=band < tolerance)
    if not out["can_tell"]:
        out["rows_needed"] = math.ceil(round(rows * (band / tolerance) ** 2, 6))  # 160.0000001: 160
    return out


def resolution_text(resolution: dict | None, thresholds: dict) -> str:
    """A sampled gate's resolution in words, the same in gate.json's verdict, the report and the card (gates from
    before it was recorded: empty), at the ``thresholds`` the gate flagged by (:func:`thresholds_of`). A count
    served twice under one seed can still differ: the request's own generator repeats its draws, but its logits
    vary with the batch it shares (batch composition), and a retried gate serves again."""
    if not resolution:
        return ""
    seeded = f"seed {resolution['seed']}" if resolution.get("seed") is not None else "unseeded"
    size = (f"{resolution['rows']} rows x {resolution['samples']} served sample"
            f"{'s' if resolution['samples'] > 1 else ''} each ({seeded}, one seed per request from it)")
    why = resolution.get("why")
    if why == "no per-request counts":
        return (f"over {size}: cannot tell sampling from a fault, the server returned no per-request counts "
                "(vLLM's --per-request-spec-decode-metrics) to compute the band over rows")
    if why == "too few accepted":
        return f"over {size}: cannot tell sampling from a fault, position 1 predicts too few accepted drafts"
    if why == "under two rows":
        return f"over {size}: cannot tell sampling from a fault, one row has no spread over rows"
    below, above = thresholds["predicted_share"], thresholds["above_share"]
    band = (f"the band at position 1, {thresholds['sampled_z']:g} standard errors over rows, is "
            f"±{resolution['band']:.3f} against a tolerance of ±{resolution['tolerance']:.3f} ({1 - below:.0%} of the "
            "prediction)")
    if resolution["can_tell"]:
        return f"over {size}: {band}: a gap outside {below:g}-{above:g} is beyond sampling"
    return (f"over {size}: {band}: this gate cannot tell sampling from a fault at this size; about "
            f"{resolution['rows_needed']} rows would (export.gate_prompts)")


def gate_verdict(acceptance: dict, expected_first: float | None, min_expected: float = 0.1,
                 predicted: dict | None = None, served_per_row: list[dict] | None = None, samples: int = 1,
                 seed: int | None = None) -> tuple[bool, str, list[dict], dict | None]:
    """Whether the served drafter behaves like the trained one, and the served acceptance by position beside
    the predicted one (:mod:`draftsmith.training.replay` on the same rows and window), each flagged below
    :data:`PREDICTED_SHARE` or above :data:`ABOVE_SHARE` of it (``flag``, and ``direction``; where the answers
    were sampled, beyond :data:`SAMPLED_Z` standard errors of the difference with rows as the unit: the served
    counts per row (``served_per_row``, over its ``samples`` served samples under ``seed``) against the
    prediction's (``predicted["per_row"]``)), and where sampled, whether the gate can tell at its size
    (:func:`gate_resolution`). The prediction is exact where the stored answers are the target's greedy ones and
    the server continues them greedily, else an estimate (:func:`basis_text`).

    ``expected_first``: what the first position should accept, the predicted served rate where there is one
    (``predicted``), else the validation accuracy of the first drafted token. Served, the first position's
    acceptance rate should be of the same order; a broken vocabulary mapping gives ~0.
    """
    if not acceptance["drafts"]:  # vLLM then reports each position's rate as None
        return False, "vLLM loaded the drafter but proposed no draft tokens", [], None
    served_rates = acceptance["acceptance_rate_per_position"] or []
    predicted_rates = (predicted or {}).get("acceptance_rate_per_position") or []
    counts = (predicted or {}).get("accepted_per_position") or [0] * len(predicted_rates)
    exactness = (predicted or {}).get("exactness") if predicted_rates else None
    sampled = bool((exactness or {}).get("sampled"))
    per_row = (predicted or {}).get("per_row") or []
    positions = []
    for i, (served, want, count) in enumerate(zip(served_rates, predicted_rates, counts, strict=False)):
        spread = rows_band(served_per_row, per_row, i) if sampled and served_per_row else None
        direction = off_prediction(served, want, count, spread or 0.0) if spread is not None or not sampled \
            else (None if count < FLAG_MIN_ACCEPTED else False)  # no band: never flagged as a fault
        positions.append({"position": i + 1, "served": served, "predicted": want, "predicted_accepted": count,
                          "ratio": served / want if count >= FLAG_MIN_ACCEPTED else None, "spread": spread,
                          "flag": None if direction is None else bool(direction), "direction": direction or None})
    resolution = gate_resolution(positions, len(per_row) or (predicted or {}).get("rows", 0), samples, seed,
                                 served_per_row is not None) if sampled else None
    source = "predicted" if predicted_rates else "validation"
    label = f", {basis_text(exactness)}" if exactness else ""
    told = f"; {resolution_text(resolution, flag_thresholds())}" if resolution else ""
    expected_first = predicted_rates[0] if predicted_rates else expected_first
    served = (served_rates or [0.0])[0] or 0.0
    if expected_first is None or expected_first < min_expected:
        return True, (f"served first-token acceptance {served:.3f}; the drafter is too weak ({source} "
                      f"{expected_first if expected_first is not None else 'unknown'}) to judge its mapping{told}"), \
            positions, resolution
    if served < expected_first / 4:
        return False, (f"served first-token acceptance {served:.3f} is far below the {source} one "
                       f"{expected_first:.3f}: the vocabulary mapping or the layer ids do not match the target"
                       f"{told}"), \
            positions, resolution
    flagged = [f"{p['position']} {p['direction']}" for p in positions if p["flag"]]
    return True, (f"served first-token acceptance {served:.3f} ({source} {expected_first:.3f}{label})"
                  + (f"; flagged, served outside {PREDICTED_SHARE:.0%}-{ABOVE_SHARE:.0%} of the predicted acceptance "
                     f"at position{'s' if len(flagged) > 1 else ''} {', '.join(flagged)}" if flagged else "") + told), \
        positions, resolution


def basis_text(exactness: dict | None) -> str:
    """A predicted figure's label in words (:func:`draftsmith.training.replay.exactness`; figures from before it
    was recorded: unlabelled)."""
    if not exactness:
        return "exactness not recorded"
    if exactness["basis"] == "exact":
        return "exact"
    share, sampled = exactness.get("agreement"), exactness.get("sampled")
    parts = [f"the stored greedy answers' tokens are the target's argmax at {share:.1%} of positions"] \
        if share is not None else []
    if sampled:
        how = "; ".join(sampling_text(s) for s in sampled["sampling"])
        parts.append(f"{sampled['positions']:,} answer tokens sampled ({how}), walked as a server sampling alike "
                     + ("accepts them, each step by its expected acceptance" if sampled["expected"] else
                        "accepts them, by the drafts they match (the sampling's penalties or min-p are not computed)")
                     + ": one path each, for serving at that sampling, not greedily")
    return "estimate: " + "; ".join(parts) if parts else "estimate"


def epoch_text(epoch: int | None) -> str:
    """An exported epoch in words, counted from 1 as training logs it; its records (``training.json``'s
    ``chosen``, ``gate.json``) count from 0, so the text names the recorded value too."""
    if epoch is None:
        return "epoch –"
    return f"epoch {epoch + 1} (recorded as \"epoch\": {epoch}, counted from 0)"


def sampling_text(sampling: dict) -> str:
    """A sampling in words: ``T=0.6, top_p 0.95``."""
    return ", ".join([f"T={sampling['temperature']:g}",
                      *(f"{key} {value:g}" for key, value in sorted(sampling.items()) if key != "temperature")])
