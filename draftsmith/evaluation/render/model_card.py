"""``results/drafter/README.md``: the description drafters are published with on the Hugging Face hub.

YAML front matter the hub reads (base model, tags, datasets, license note), then what to serve on the first
screen (per concurrency band the vLLM command of the setting the pick serves first there, one that needs no
drafter and ranked above this drafter, then this drafter's, each with what it gave), the acceptance per
evaluation set and temperature, the serving recipe band by band (why each setting, SGLang's commands), the one
config for every batch size, what it was trained on, the recipe, the config digest and how to reproduce it.
Every figure comes from the run's own records; each rule's wording comes from the function beside the code
that applies it, which the report calls too, so the two never differ.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import yaml

from draftsmith.core.platform import cpu_draft_length_text, cpu_ranking_text
from draftsmith.core.units import human_bytes
from draftsmith.data.datasets import hub_id
from draftsmith.evaluation.decide.pick import (
    FIGURES,
    figures,
    first_to_serve,
    load_changed_text,
    recorded,
    serve_first,
    serve_first_text,
    serving_by_workload,
)
from draftsmith.evaluation.decide.schedule import (
    band_parts,
    band_text,
    bands,
    beaten_by,
    one_config_text,
    unmeasured_text,
)
from draftsmith.evaluation.measure.evaluate import held_rule_text
from draftsmith.evaluation.measure.methods import DISPLAY_NAME, DRAFTER_HERE, PLAIN, served_command, speculative_config
from draftsmith.generation.generate import GenerationSettings
from draftsmith.training.export import (
    basis_text,
    epoch_text,
    gate_window,
    resolution_text,
    sampling_text,
    served_weight_bytes,
    thresholds_of,
)


@dataclass
class CardInputs:
    base_model: str
    config_digest: str
    datasets: dict[str, dict]  # the config's datasets (source, weight, generation), results-relevant keys only
    results: dict
    training: dict
    merge: dict
    prompts: dict[str, dict]
    train_config: dict  # the exported family's training settings
    drafter_config: dict  # the exported config.json (layers, block size, mask token)
    sglang_reason: str | None  # None: the SGLang export is in sglang/
    serving: dict | None = None  # serving.json: the schedule, its config and its measurement
    gate: dict | None = None  # the published family's export gate: served against predicted by position
    workloads: dict[str, str] = field(default_factory=dict)  # each evaluation set's workload (its label)
    size: dict | None = None  # final.safetensors' size (export.drafter_size)
    served_flags: list[str] = field(default_factory=list)  # every measurement's engine flags (methods.served_flags)

    @property
    def family(self) -> str:
        return self.results.get("family", "eagle3")  # results from before families were EAGLE-3


def front_matter(inputs: CardInputs) -> str:
    hub = sorted({h for entry in inputs.datasets.values() if (h := hub_id(entry["source"]))})
    meta = {"base_model": inputs.base_model, "library_name": "vllm",
            "tags": ["speculative-decoding", inputs.family, "speculators", "draftsmith"],
            **({"datasets": hub} if hub else {}), "license": "other",
            "license_name": "same-as-base-model",
            "license_link": f"https://huggingface.co/{inputs.base_model}"}
    return "---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n"


def plan_of(inputs: CardInputs) -> dict | None:
    """The published schedule, as ``serving.json`` holds it (the pick's copy where there is none)."""
    return (inputs.serving or {}).get("schedule") or inputs.results.get("schedule")


def _vllm(inputs: CardInputs, config: dict | None) -> str:
    return served_command(inputs.base_model, config, inputs.served_flags)


def _figures(cell: dict) -> str:
    return (f"speed-up {_num(cell['speedup'], '.2f')}×, {_num(cell['tokens_per_step'], '.3f')} tokens per target "
            f"step" + (f" (τ per draft {_num(cell['tau'], '.3f')})" if cell.get("tau") is not None else ""))


MEASURE_ON_GPUS = "Measure on your GPUs with `./run.sh` and `server.gpus` set before serving it there."
ABOVE = "The command is under What to serve, above."  # a command the first screen gives is not repeated below
COUNTED_AT_COMPLETION = "completed requests"  # evaluate.TOKENS_COUNTED["sglang"]: a run's ``tokens_counted``
DRAIN_NOTE = ("SGLang counts a request's tokens when it ends: these windows run to the last answer, so the tail below "
              "concurrency c is inside them.")


def drain_note(results: dict) -> list[str]:
    """:data:`DRAIN_NOTE` as a paragraph where any run counted its tokens at completion (SGLang): its speed-ups
    are not at concurrency c alone, the drain below it is timed too; nothing otherwise."""
    runs = (run for evaluation in results.get("methods", {}).values()
            for point in [*evaluation.get("cells", []), *evaluation.get("baseline", [])]
            for run in point.get("runs", []))
    return [DRAIN_NOTE, ""] if any(run.get("tokens_counted") == COUNTED_AT_COMPLETION for run in runs) else []


def what_to_serve(inputs: CardInputs) -> list[str]:
    """The card's first screen: per concurrency band, the setting measured best there first where it needs no
    drafter (a training-free method, or plain serving), then this drafter's own command, each with what it gave;
    a short note under the band for what did not hold, and under them all for a CPU's ranking."""
    results, family = inputs.results, inputs.family
    by_concurrency = {e["concurrency"]: e for e in results.get("serving", [])}
    per_workload = serving_by_workload(results.get("methods") or {}, results.get("concurrency") or [],
                                       results["pick"]["by"], inputs.workloads) if results.get("methods") else {}
    device = "a GPU" if results.get("on_accelerator") else "a CPU"
    lines = ["## What to serve", "",
             f"Measured with {results['engine']} on {device}, ranked by {FIGURES[results['pick']['by']]}. "
             f"{serve_first_text(bool(results.get('on_accelerator')))} Run the commands from inside this folder; "
             "each carries the engine flags the measurement ran with."]
    for band in bands(plan_of(inputs), results["concurrency"]):
        entry = by_concurrency.get(band["concurrency"], {})
        best, ours = _served_first(entry, family, bool(results.get("on_accelerator")))
        heading = band_text(band)
        lines += ["", f"### {heading[0].upper()}{heading[1:]}", ""]
        if best is not None:
            lines += [_best_line(best), *_command(inputs, best)]
        if ours is None:
            lines.append(f"{DISPLAY_NAME[family]} was not measured at this concurrency.")
        else:
            lines += [f"This drafter, {_tokens(ours['k'])}: {_figures(ours)}.", *_command(inputs, ours)]
        lines += _band_notes(entry)
        lines += _workloads_apart(inputs, per_workload, band["concurrency"], best or ours)
    if not results.get("on_accelerator"):
        lines += ["", cpu_ranking_text()]
    return lines


def _workloads_apart(inputs: CardInputs, per_workload: dict[str, list[dict]], concurrency: int,
                     pooled: dict | None) -> list[str]:
    """Each workload whose own sets, ranked alone, put another setting first at a band than the pooled sets did:
    that setting and its command (:func:`~draftsmith.evaluation.decide.pick.serving_by_workload`)."""
    lines = []
    for workload, entries in per_workload.items():
        entry = next((e for e in entries if e["concurrency"] == concurrency), {})
        ranked = entry.get("ranked", [])
        ours = next((c for c in ranked if c["method"] == inputs.family), None)
        own = first_to_serve(entry, inputs.family, bool(inputs.results.get("on_accelerator"))) or ours
        same = pooled is not None and own is not None and (own["method"], own["k"]) == (pooled["method"], pooled["k"])
        if own is None or same or entry.get("nothing_held"):
            continue
        sets = ", ".join(sorted(name for name, w in inputs.workloads.items() if w == workload))
        setting = "this drafter" if own is ours else DISPLAY_NAME.get(own["method"], own["method"])
        lines += ["", f"For {workload} traffic ({sets}) alone, {setting} ranked first: {_tokens(own['k'])}, "
                      f"{_figures(own)}.", *_command(inputs, own)]
    return lines


def _served_first(entry: dict, family: str, accelerator: bool) -> tuple[dict | None, dict | None]:
    """The cells whose commands a band of the first screen gives: the setting the pick chose to serve before this
    drafter (:func:`~draftsmith.evaluation.decide.pick.serve_first`), and this drafter's best."""
    ours = next((c for c in entry.get("ranked", []) if c["method"] == family), None)
    return serve_first(entry, family, accelerator), ours


def _best_line(cell: dict) -> str:
    """The best setting of a band that needs no drafter, in one sentence."""
    if cell["method"] == PLAIN:
        return "Serve without speculation: the target alone was fastest here."
    return f"{DISPLAY_NAME[cell['method']]}, {_tokens(cell['k'])}, needs no drafter: {_figures(cell)}."


def _command(inputs: CardInputs, cell: dict) -> list[str]:
    """The vLLM command serving a ranked cell as it was measured: this drafter from its folder, a training-free
    method with the measurement's settings."""
    if cell["method"] == PLAIN:
        config = None
    elif cell["trained"]:
        config = speculative_config(cell["method"], cell["k"], {}, DRAFTER_HERE)
    else:
        config = speculative_config(cell["method"], cell["k"], inputs.results)
    return ["```bash", _vllm(inputs, config), "```"]


def _band_notes(entry: dict) -> list[str]:
    """Short notes under a band: a band where nothing held, each cell that did not hold and why, and the rule."""
    if not entry.get("not_held"):
        return []
    notes = [f"{DISPLAY_NAME.get(n['method'], n['method'])} {_tokens(n['k'])} did not hold this concurrency: "
             f"{n['why']}." for n in entry["not_held"]]
    if entry.get("nothing_held"):
        notes.insert(0, "No method held this concurrency, so no setting is recommended here until it is measured "
                        "again.")
    return [line for note in [*notes, held_rule_text()] for line in ("", note)]


def serving(inputs: CardInputs) -> list[str]:
    """Per concurrency band: this drafter at the draft length measured best there, or plain serving where the
    target alone was faster on an accelerator; every training-free method that beat this drafter there; SGLang's
    command. A vLLM command the first screen gives (:func:`what_to_serve`) is pointed to, not repeated."""
    results, family = inputs.results, inputs.family
    by_concurrency = {e["concurrency"]: e for e in results.get("serving", [])}
    figure = FIGURES[results["pick"]["by"]]
    accelerator = results.get("on_accelerator")
    where = f"a GPU, ranked by {figure}" if accelerator else f"a CPU (vLLM's CPU build), ranked by {figure}"
    lines = ["## Serving recipe, band by band", "",
             f"Measured by draftsmith with {results['engine']} at concurrency "
             f"{', '.join(map(str, results['concurrency']))} (each the requests held in flight), each setting "
             f"against the target alone, on {where}. Tokens per target step count every step.", "",
             *([] if accelerator else [f"{cpu_draft_length_text()} {MEASURE_ON_GPUS}", ""]), *drain_note(results)]
    evaluation = results["methods"].get(family, {})
    for band in bands(plan_of(inputs), results["concurrency"]):
        entry = by_concurrency.get(band["concurrency"], {})
        ranked = entry.get("ranked", [])
        ours = next((i for i, cell in enumerate(ranked) if cell["method"] == family), None)
        plain = next((i for i, cell in enumerate(ranked) if cell["method"] == PLAIN), None)
        heading = band_text(band)
        lines += [f"### {heading[0].upper()}{heading[1:]}", ""]
        lines += _not_held(entry)
        if ours is None:
            lines += [f"{DISPLAY_NAME[family]} was not measured at this concurrency.", ""]
        elif accelerator and plain is not None and plain < ours and _training_free_ahead(inputs, entry, ours, figure):
            lines += [f"The target alone was faster than {DISPLAY_NAME[family]} here at every draft length (its best, "
                      f"{_tokens(ranked[ours]['k'])}: {_figures(ranked[ours])}), and a method that needs no drafter "
                      "was faster than both:", ""]
        elif accelerator and plain is not None and plain < ours and entry.get("nothing_held"):
            lines += [f"{DISPLAY_NAME[family]} read slower than the target alone here (its best, "
                      f"{_tokens(ranked[ours]['k'])}: {_figures(ranked[ours])}) in windows that did not hold: no "
                      "setting is recommended at this band until it is measured again.", ""]
        elif accelerator and plain is not None and plain < ours:
            lines += [f"**Serve without speculation here**: the target alone was faster than {DISPLAY_NAME[family]} "
                      f"at every draft length (its best, {_tokens(ranked[ours]['k'])}: "
                      f"{_figures(ranked[ours])}). {ABOVE}", ""]
        else:
            cell = ranked[ours]
            lines += [f"{DISPLAY_NAME[family]}, {_tokens(cell['k'])}: {_figures(cell)}. {ABOVE}", ""]
            if inputs.sglang_reason is None:
                k = cell["k"]
                lines += ["SGLang (the `sglang/` folder, EAGLE-3 layout):", "", "```bash",
                          f"python -m sglang.launch_server --model-path {inputs.base_model} "
                          "--speculative-algorithm EAGLE3 \\",
                          f"  --speculative-draft-model-path {DRAFTER_HERE}/sglang --speculative-num-steps {k} \\",
                          f"  --speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}", "```", ""]
        lines += _training_free_ahead(inputs, entry, ours, figure)
    if inputs.sglang_reason is not None:
        lines += [f"SGLang: no SGLang export was written ({inputs.sglang_reason})."]
    if not evaluation.get("cells"):
        lines += ["", f"{DISPLAY_NAME[family]} was not measured here."]
    return lines


def _not_held(entry: dict) -> list[str]:
    """What did not hold at a band: each cell ranked at what it delivered, and a band where nothing held said
    so, so that no verdict there (plain serving's least of all) reads as measured at its concurrency."""
    if not entry.get("not_held"):
        return []
    cells = "; ".join(f"{DISPLAY_NAME.get(n['method'], n['method'])} {_tokens(n['k'])}: {n['why']}"
                      for n in entry["not_held"])
    if entry.get("nothing_held"):
        return [f"**No method held this concurrency** ({cells}): the figures here are what was measured as it ran, "
                "the band is unmeasured, and the target alone did not win it.", ""]
    return [f"Ranked at what it delivered, not at the concurrency it did not hold: {cells}.", ""]


def _training_free_ahead(inputs: CardInputs, entry: dict, ours: int | None, figure: str) -> list[str]:
    """Every training-free method ranked above this drafter at a band, each with its command, whether or not
    another trained family beat it too; on an accelerator, only those that beat the target alone as well
    (one below it is no setting to serve)."""
    ranked = entry.get("ranked", [])
    plain = next((i for i, cell in enumerate(ranked) if cell["method"] == PLAIN), len(ranked))
    above = min(len(ranked) if ours is None else ours, plain if inputs.results.get("on_accelerator") else len(ranked))
    ahead = [cell for cell in ranked[:above] if not cell["trained"] and cell["method"] != PLAIN]
    shown = _served_first(entry, inputs.family, bool(inputs.results.get("on_accelerator")))[0]
    lines = []
    for cell in ahead:
        against = f"this drafter's {ranked[ours]['score']:.3f}" if ours is not None else "this drafter, not measured"
        lines += [f"**{DISPLAY_NAME[cell['method']]}, which needs no drafter, beat this drafter here**: "
                  f"{_tokens(cell['k'])}, {_figures(cell)}; {figure} {cell['score']:.3f} against {against}. "
                  + (f"Serve it instead at this concurrency. {ABOVE}" if cell == shown else
                     "Serve it instead at this concurrency:"), "",
                  *([] if cell == shown else [*_command(inputs, cell), ""])]
        if cell["method"] == "suffix":
            lines += ["Suffix decoding was measured without its tree of earlier answers "
                      "(`suffix_decoding_max_cached_requests: 0`): the measurement sends each prompt more than "
                      "once, and an earlier answer to the same prompt would count as drafted. On traffic that "
                      "repeats itself, vLLM's default (10,000 earlier answers) may accept more.", ""]
    return lines


def schedule(inputs: CardInputs) -> list[str]:
    """The one config for every batch size: vLLM's dynamic speculative decoding with the draft length of each
    band (none where plain serving wins), and what it measured served as one (``serving.json``)."""
    served = inputs.serving
    if not served:
        return []
    if inputs.results.get("engine", "vllm") != "vllm":  # a vLLM schedule from another engine's cells: never served
        return ["## One config for every batch size", "",
                f"vLLM's dynamic speculative decoding (`num_speculative_tokens_per_batch_size`) is vLLM's only, and "
                f"these figures were measured with {inputs.results['engine']}: no schedule is given, since none was "
                "measured. Use the per-band commands above."]
    plan, config = served["schedule"], served["speculative_config"]
    single = beaten_by(plan, inputs.results.get("serving", []))
    lead = [one_config_text(plan, inputs.results.get("serving", [])), ""] + ([] if single is None else [
        "```bash", _vllm(inputs, speculative_config(single["method"], single["k"], inputs.results)), "```",
        "", "This drafter's own config for every batch size, if you serve it:", ""])
    # serving.json's config served with the measurement's engine flags
    command = ["```bash", _vllm(inputs, config), "```"]
    if plan["kind"] == "plain":
        said = ["The target alone was fastest at every measured concurrency"
                + (" that held" if plan.get("not_held") else "") + ": serve without speculation."
                + unmeasured_text(plan)]
    elif plan["kind"] == "fixed":
        said = [f"{DISPLAY_NAME[plan['family']]} drafts {_tokens(plan['max_k'])} at every measured concurrency, so "
                "one fixed config serves every batch size; the grid measured it (`serving.json` holds it)."
                + unmeasured_text(plan)]
    else:
        failed = [c["failed"] for c in (served.get("measured") or {}).get("cells", []) if c.get("failed")]
        said = ["vLLM's dynamic speculative decoding (`num_speculative_tokens_per_batch_size`) drafts a length of "
                "its own at each band of batch sizes, read by its scheduler at every step:", "",
                *(f"- {part}" for part in band_parts(plan)), "",
                f"**vLLM could not serve it here** ({failed[0]}): use the per-band commands above." if failed
                else "One command for mixed traffic; `serving.json` holds the config. SGLang has no such schedule: "
                     "use the per-band commands above. vLLM ignores it with data parallelism (`--data-parallel-size` "
                     "above 1), serving the largest k at every batch size:"]
        command = ([] if failed else command) + ["", *schedule_table(served.get("measured") or {}, inputs.results)]
    return ["## One config for every batch size", "", *lead, *said, "", *command, *_cpu_caveat(inputs.results)]


def _cpu_caveat(results: dict) -> list[str]:
    """Beside a config measured on a CPU: its draft length is what tokens per step prefer, not a GPU's best."""
    if results.get("on_accelerator", True):
        return []
    return ["", f"{cpu_draft_length_text()} {MEASURE_ON_GPUS}"]


def schedule_table(measured: dict, results: dict) -> list[str]:
    """The schedule served as one config, beside each concurrency's best fixed cell."""
    if measured.get("skipped"):
        return [f"Not served as one config here: {measured['skipped']}."]
    cells = {c["concurrency"]: c for c in measured.get("cells", [])}
    best = {e["concurrency"]: e.get("best") for e in results.get("serving", [])}
    lines = ["Served as one config and measured at every concurrency of the grid:", "",
             "| concurrency | schedule: speed-up | tokens / step | best fixed setting | speed-up | tokens / step |",
             "|---:|---:|---:|---|---:|---:|"]
    for c in sorted(cells):
        cell = cells[c]
        if cell.get("failed"):
            lines.append(f"| {c} | failed: {cell['failed']} | – | – | – | – |")
            continue
        got, fixed = figures(cell), best.get(c) or {}
        lines.append(f"| {c} | {_num(got['speedup'], '.2f')}× | {_num(got['tokens_per_step'], '.3f')} | "
                     f"{DISPLAY_NAME.get(fixed.get('method'), '–')} k={fixed.get('k', '–')} | "
                     f"{_num(fixed.get('speedup'), '.2f')}× | {_num(fixed.get('tokens_per_step'), '.3f')} |")
    return lines


def gate_table(gate: dict) -> list[str]:
    """A gate's served acceptance by position beside the predicted one, labelled exact or estimate; where the
    gate was served with no prediction, why (gates from before either: none)."""
    positions = gate.get("positions") or []
    if not positions:
        return [f"No prediction to set beside the served acceptance: {gate['predicted_missing']}."] \
            if gate.get("predicted_missing") else []
    predicted, thresholds = gate.get("predicted") or {}, thresholds_of(gate)
    # no ratio over a prediction too small to judge (gates from before computed one: not shown)
    rows = [f"| {p['position']} | {p['predicted']:.3f} | {p['served']:.3f} | "
            f"{_num(p['ratio'] if p['flag'] is not None else None, '.2f')} | {_flag(p, thresholds)} |"
            for p in positions]
    told = resolution_text(gate.get("resolution"), thresholds)
    return ["| position | predicted | served | served / predicted | |", "|---:|---:|---:|---:|---|", *rows, "",
            f"Over {predicted.get('rows', '–')} rows: {_num(predicted.get('drafts'), 'g')} drafts predicted, "
            f"{_num(gate['acceptance'].get('drafts'), 'g')} served. Predicted: "
            f"{basis_text(predicted.get('exactness'))}"
            + ("" if ((predicted.get("exactness") or {}).get("agreement") or 1.0) == 1.0 else
               " (the gate's server continues greedy answers greedily: where a stored token is not the target's "
               "argmax, a near-tie, it serves other text than the replay walks)") + "."
            + (f" Sampled, {told}." if told else "")]


def _flag(position: dict, thresholds: dict) -> str:
    """A position's flag in words, at the ``thresholds`` its gate flagged by."""
    below, above = thresholds["predicted_share"], thresholds["above_share"]
    if position["flag"] is None:
        return f"too few to judge ({position.get('predicted_accepted', 0):.3g} predicted accepted)"
    if not position["flag"]:
        ratio, spread = position.get("ratio"), position.get("spread")
        outside = ratio is not None and not below <= ratio <= above
        return f"within the two samples' spread (±{thresholds['sampled_z'] * spread:.3f})" if outside and spread \
            else ""
    if position.get("direction") == "above":
        return f"**above {above:g}**"
    return f"**below {below:g}**"  # gates from before the flag looked both ways: below


def predicted_against_served(inputs: CardInputs) -> list[str]:
    """The published drafter's served acceptance by position against what its validation predicted."""
    table = gate_table(inputs.gate or {})
    if not table:
        return []
    return ["## Served against predicted", "",
            f"At the export gate vLLM served {_gate_epoch(inputs.gate)}the first turns of validation rows, up to "
            f"{gate_window(inputs.gate)} tokens each. The same drafter, replayed on the stored hidden states of those "
            "rows as a server drafts and verifies, predicted:", "", *table]


def _gate_epoch(gate: dict | None) -> str:
    """The epoch the gate served, where its record says (gates record it counted from 0)."""
    return f"the exported {epoch_text(gate['epoch'])} on " if (gate or {}).get("epoch") is not None else ""


def load_changed(results: dict) -> list[str]:
    """Windows whose target alone disagreed: the speed-ups they touch compare windows as much as methods."""
    changes = results.get("load_changed") or []
    if not changes:
        return []
    lines = ["## The machine's load changed between measurements", "",
             load_changed_text(), ""]
    return lines + [f"- concurrency {c['concurrency']}, {c['set']}, T={c['temperature']:g}: "
                    + ", ".join(f"{DISPLAY_NAME.get(m, m)} {v:g} tok/s" for m, v in c["baseline_tok_s"].items())
                    + f" ({c['spread']:+.0%})" for c in changes]


def recipe_by_workload(results: dict, workloads: dict[str, str]) -> list[str]:
    """Per workload (``workloads``: each prompt set's, where they hold two or more), each concurrency's best
    setting and the best trained against the best training-free one, ranked on that workload's sets alone
    (:func:`~draftsmith.evaluation.decide.pick.serving_by_workload`), beside the pooled best: agent traffic that repeats
    its context may want another method than chat."""
    per = serving_by_workload(results.get("methods") or {}, results.get("concurrency") or [], results["pick"]["by"],
                              workloads) if results.get("methods") else {}
    if not per:
        return []
    pooled = {e["concurrency"]: e.get("best") for e in results.get("serving", [])}
    lines = ["## Recipe per workload", "",
             f"Each workload's prompt sets ranked alone, by {FIGURES[results['pick']['by']]}, beside the best of all "
             "sets pooled; where they differ, serve the workload's own at that concurrency."]
    for workload, entries in per.items():
        sets = ", ".join(sorted(name for name, w in workloads.items() if w == workload))
        lines += ["", f"### {workload} ({sets})", "",
                  "| concurrency | best | best trained | best training-free | pooled best |", "|---:|---|---|---|---|"]
        for entry in entries:
            unheld = " (no method held it)" if entry.get("nothing_held") else ""
            lines.append(f"| {entry['concurrency']} | {_setting(entry.get('best'))}{unheld} | "
                         f"{_setting(entry.get('best_trained'))} | {_setting(entry.get('best_training_free'))} | "
                         f"{_setting(pooled.get(entry['concurrency']))} |")
    return lines


def _setting(cell: dict | None) -> str:
    """A ranked cell in a few words: method, draft length and its figures."""
    if not cell:
        return "–"
    k = "" if cell["method"] == PLAIN else f" k={cell['k']}"
    return (f"{DISPLAY_NAME.get(cell['method'], cell['method'])}{k}: {_num(cell['speedup'], '.2f')}×, "
            f"{_num(cell['tokens_per_step'], '.3f')} tok/step")


NO_TOOL_CALLS = "the target made no tool calls on this set: its figures measure plain answers to tool prompts"


def tool_calls(results: dict, workloads: dict[str, str]) -> list[str]:
    """How many tool calls the target made on each set sent with tools; a set with none is named, since its
    figures then measure text answers, not the calls and results agent traffic holds."""
    used = recorded(results, "tool_use")
    if not used:
        return []
    lines = ["## Tool calls", "",
             "Sets with tools were sent them on every request (`tool_choice: auto`), each call answered with the "
             "dataset's result as generation pairs them; the calls the target made, over every window measured:", ""]
    for name, counts in used.items():
        workload = f" ({workloads[name]})" if name in workloads else ""
        lines.append(f"- {name}{workload}: {counts['tool_calls']} tool calls in {counts['requests_with_tools']} "
                     "requests with tools" + ("" if counts["tool_calls"] else f"; **{NO_TOOL_CALLS}**"))
    return lines


def _tokens(k: int) -> str:
    return f"{k} draft token{'' if k == 1 else 's'}"


def _num(value: float | None, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def pick(results: dict) -> list[str]:
    """Why this family is the one published, with every family's figures beside it."""
    chosen, rows = results.get("pick"), results.get("families") or []
    if not chosen or len(rows) < 2:
        return []
    lines = ["## Why this family", "",
             f"draftsmith trained {', '.join(DISPLAY_NAME[r['family']] for r in rows)} from the same data and "
             f"served each on the same prompts; this one had the {chosen['why']}. Each at its best draft length at "
             f"concurrency {chosen['at']} (speed-up: geometric mean over prompt sets and temperatures):", "",
             "| family | draft tokens | tokens / step | speed-up |", "|---|---:|---:|---:|"]
    for row in rows:
        if not row["served"]:
            lines.append(f"| {DISPLAY_NAME[row['family']]} | – | {row['excluded']}: {row['reason']} | – |")
            continue
        best = row["best"] or {}
        lines.append(f"| {DISPLAY_NAME[row['family']]} | {best.get('k', '–')} | "
                     f"{_num(best.get('tokens_per_step'), '.3f')} | {_num(best.get('speedup'), '.2f')}× |")
    return lines


def results_table(results: dict) -> list[str]:
    chosen = results["pick"]
    lines = ["## Acceptance", "",
             f"Mean acceptance length τ, **pooled** over every draft (1 + accepted draft tokens / drafts), and tokens "
             f"per target step, {chosen['k']} draft tokens at concurrency {chosen['at']}, measured by "
             f"{results['engine']} on held-out prompts (decontaminated against the training prompts):", "",
             "| prompt set | prompts | temperature | τ (pooled) | tokens / step | acceptance by position |",
             "|---|---:|---:|---:|---:|---|"]
    silent = {name for name, counts in recorded(results, "tool_use").items() if not counts["tool_calls"]}
    for run in results["runs"]:
        acc = run["acceptance"]
        per_pos = ", ".join(f"{r:.2f}" for r in acc.get("acceptance_rate_per_position", []))
        name = f"{run['set']} (no tool calls: see below)" if run["set"] in silent else run["set"]
        lines.append(f"| {name} | {run['prompts']} | {run['temperature']:g} | {_num(acc['tau_pooled'], '.3f')} | "
                     f"{_num(acc.get('tokens_per_step'), '.3f')} | {per_pos} |")
    return lines


def size(inputs: CardInputs) -> list[str]:
    """The drafter's size, and the memory its weights add where it is served in the dtype the target was measured
    in (results from before that was recorded: its size alone)."""
    if not inputs.size:
        return []
    dtype = (inputs.results.get("compute") or {}).get("dtype")
    stored = (f"{inputs.size['parameters']:,} parameters, {human_bytes(inputs.size['file_bytes'])} in "
              "`final.safetensors`.")
    served = (f" Served in {dtype}, as it was measured, its weights add "
              f"{human_bytes(served_weight_bytes(inputs.size, dtype))} to the target's memory; the KV cache of its "
              "draft layers comes out of the target's.") if dtype else ""
    return ["## Size", "", stored + served]


def training_data(inputs: CardInputs) -> list[str]:
    lines = ["## Training data", "",
             "Answers regenerated by the target itself; prompts that match an evaluation prompt or an earlier "
             "dataset were dropped before generation.", "",
             "| dataset | source | answers sampled at | prompts kept | dropped (eval match / duplicate) | weight | "
             "train rows | validation rows | train supervised tokens |", "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, mix in inputs.merge["datasets"].items():
        st = inputs.prompts.get(name, {})
        dropped = st.get("dropped", {})
        entry = inputs.datasets.get(name, {})
        gen = entry.get("generation") or {}
        sampled = "– (pre-tokenized)" if entry.get("kind") == "tokenized" or not gen else \
            f"{sampling_text(GenerationSettings.from_config(gen).sampling())}, max {gen['max_tokens']} tokens"
        source = hub_id(entry.get("source", "")) or entry.get("source", "–")
        lines.append(f"| {name} | `{source}` | {sampled} | {st.get('kept', '–')} | "
                     f"{dropped.get('exact', 0) + dropped.get('ngram', 0)} / {dropped.get('duplicate', 0)} | "
                     f"{mix['weight']:g} | {mix['train_rows']} | {mix['validation_rows']} | "
                     f"{mix['train_supervised_tokens']:,} |")
    return lines


def recipe(inputs: CardInputs) -> list[str]:
    t, tr = inputs.train_config, inputs.training
    model = _eagle3_model(t) if inputs.family == "eagle3" else _block_model(t, tr, inputs.drafter_config)
    chosen = tr.get("chosen", {})
    epoch = chosen.get("epoch")
    storage = tr["hidden_states"].get("storage")
    if tr["hidden_states"].get("mode") == "online":
        stored = ", hidden states online (never stored)"
    else:  # runs from before storage was a choice stored bf16, unsaid
        stored = f", their hidden states stored in {storage}" if storage else ""
    return ["## Recipe", "",
            f"speculators {DISPLAY_NAME[inputs.family]}, {model}, {t['epochs']} epochs, lr {t['lr']}, "
            f"{t['optimizer']}, {t['scheduler']} schedule, sequence length {t['total_seq_len']}; target layers "
            f"{tr['hidden_states']['aux_layers']}{stored}; "
            + ("warm start from `" + tr["warm_start"]["source"] + "`" if tr.get("warm_start") else "from scratch")
            + f". Exported {epoch_text(epoch)}: {chosen.get('reason', '–')}."
            + _trainer(tr.get("trainer")),
            "", f"Config digest: `{inputs.config_digest}` (what the results depend on; operational settings "
            "excluded)."]


def _eagle3_model(t: dict) -> str:
    head = "trained" if t["train_lm_head"] else "frozen (the target's)"
    return (f"{t['num_layers']} draft layer(s), `{t['architecture']}` architecture, TTT {t['ttt_steps']} steps "
            f"(decay {t['ttt_step_loss_decay']}), loss `{t['loss_fn']}`, draft LM head {head}")


def _block_model(t: dict, training: dict, drafter: dict) -> str:
    layers = drafter["transformer_layer_config"]["num_hidden_layers"]
    why = (training.get("mask_token") or {}).get("why")
    return (f"{layers} draft layer(s), blocks of {drafter['block_size']} positions, mask token "
            f"{drafter['mask_token_id']}{f' ({why})' if why else ''}, loss `{t['loss_fn'] or 'speculators recipe'}`")


def _trainer(choice: dict | None) -> str:
    """How the loss was computed and whether the forward was compiled, and why (runs from before
    the choice existed say nothing)."""
    if not choice:
        return ""
    return (f" Loss computed **{choice['loss_implementation']}**, forward "
            f"{'compiled' if choice['compile'] else 'not compiled'}: {choice['reason']}.")


def _section(lines: list[str]) -> list[str]:
    return [*lines, ""] if lines else []


def card(inputs: CardInputs) -> str:
    lines = [front_matter(inputs),
             f"# {DISPLAY_NAME[inputs.family]} drafter for {inputs.base_model}", "",
             f"A speculative-decoding drafter trained by draftsmith with "
             f"[speculators](https://github.com/vllm-project/speculators) on answers regenerated by "
             f"`{inputs.base_model}`; the base model's license applies.", "",
             *what_to_serve(inputs), "", *results_table(inputs.results), "", *_section(size(inputs)),
             *serving(inputs), "", *_section(schedule(inputs)), *_section(load_changed(inputs.results)),
             *_section(recipe_by_workload(inputs.results, inputs.workloads)),
             *_section(tool_calls(inputs.results, inputs.workloads)),
             *_section(predicted_against_served(inputs)),
             *_section(pick(inputs.results)),
             *training_data(inputs), "",
             *recipe(inputs), "",
             "## Reproduce", "", "```bash", "./run.sh --configfile draftsmith.yaml", "```", "",
             "`draftsmith.yaml` is the effective config this drafter was made with, its secret values redacted; "
             "`versions.json` names the vLLM, speculators, torch and transformers it ran with. The same config "
             "digest means the same data, split and recipe.", ""]
    return "\n".join(lines)
