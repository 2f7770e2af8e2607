"""The report: a Markdown page and PNG plots from the evaluation results and every stage's stats."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from draftsmith.core.atomic import atomic_path, write_text
from draftsmith.core.platform import cpu_draft_length_text, cpu_ranking_text
from draftsmith.data.repetition import looping_text
from draftsmith.evaluation.decide import pick
from draftsmith.evaluation.decide.pick import FIGURES, figures, label_of
from draftsmith.evaluation.decide.schedule import describe_bands, one_config_text
from draftsmith.evaluation.measure.evaluate import held_rule_text, readings_text
from draftsmith.evaluation.measure.methods import DISPLAY_NAME
from draftsmith.evaluation.render.model_card import (
    drain_note,
    gate_table,
    load_changed,
    recipe_by_workload,
    schedule_table,
    tool_calls,
)
from draftsmith.training.export import (
    basis_text,
    epoch_text,
    flag_rule_text,
    gate_window,
    thresholds_of,
)
from draftsmith.training.families import DEFAULT_FAMILY, step_accuracies


@dataclass
class Inputs:
    results: dict
    generation: dict[str, dict]
    prompts: dict[str, dict]
    merge: dict
    vocab: dict
    training: dict
    gate: dict
    serving: dict | None = None  # serving.json: the published method's schedule and its measurement
    tokenized: dict[str, dict] | None = None  # each generated dataset's tokenize stats (its answers' repetition)
    gates: dict[str, dict] | None = None  # every trained family's export gate: served against predicted
    workloads: dict[str, str] = field(default_factory=dict)  # each evaluation set's workload (its label)


def _baselines(methods: dict[str, dict]) -> str:
    """Where each method's baseline was measured: once for the grid, or in its own job (on a CPU, or on GPUs
    other than the grid's baseline ran on)."""
    own = [m for m, e in methods.items() if e.get("cells") and not e.get("baseline_shared")]
    if len(own) == len([e for e in methods.values() if e.get("cells")]):
        return "measured in the same job."
    return ("measured once for the whole grid (GPUs, measured one at a time)"
            + (f"; {', '.join(own)} measured it again in its own job, on other GPUs." if own else "."))


def _fmt(value, spec: str = ".2f") -> str:
    return "–" if value is None else format(value, spec)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, out: Path) -> None:
    with atomic_path(out, suffix=".png") as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    _pyplot().close(fig)


def _label(run: dict) -> str:
    return f"{run['set']} T={run['temperature']:g}"


def _cells(results: dict) -> list[tuple[str, dict]]:
    """Every measured cell of every method (the trained drafter's and each training-free method's),
    as (method, cell), in the listed order of methods, draft lengths and concurrencies."""
    return [(method, cell) for method, evaluation in results["methods"].items()
            for cell in evaluation.get("cells", []) if cell["drafter"] == label_of(evaluation)]


def _row_name(method: str, k: int) -> str:
    return f"{DISPLAY_NAME[method]} k={k}"


def pooled_positions(cell: dict) -> list[float]:
    """Acceptance rate by draft position over a cell's runs, weighted by each run's drafts."""
    rows = [(r["acceptance"]["drafts"] or 0, r["acceptance"]["acceptance_rate_per_position"]) for r in cell["runs"]]
    drafts = sum(d for d, _ in rows)
    width = max((len(rates) for _, rates in rows), default=0)
    if not drafts:
        return []
    return [sum(d * (rates[i] or 0) for d, rates in rows if i < len(rates)) / drafts for i in range(width)]


def plot(results: dict, out: Path) -> None:
    """Acceptance by draft position per cell, and tokens per target step per method and draft length at
    each concurrency."""
    plt = _pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    cells = _cells(results)
    positions = 0
    for method, cell in cells:
        rates = pooled_positions(cell)
        positions = max(positions, len(rates))
        ax1.plot(range(1, len(rates) + 1), rates, marker="o",
                 label=f"{_row_name(method, cell['k'])} @{cell['concurrency']}")
    ax1.set_xticks(range(1, positions + 1))
    ax1.set(title="Draft acceptance rate by position (pooled over sets and T)", xlabel="draft position",
            ylabel="accepted / drafts", ylim=(0, 1))
    ax1.legend(fontsize=7)
    rows = list(dict.fromkeys((m, c["k"]) for m, c in cells))
    concurrencies = results["concurrency"]
    width = 0.8 / max(1, len(rows))
    for i, (method, k) in enumerate(rows):
        values = [next((figures(c)["tokens_per_step"] or 0 for m, c in cells
                        if (m, c["k"], c["concurrency"]) == (method, k, at)), 0) for at in concurrencies]
        ax2.bar([x - 0.4 + width / 2 + i * width for x in range(len(concurrencies))], values, width,
                label=_row_name(method, k))
    ax2.set_xticks(range(len(concurrencies)), [f"concurrency {c}" for c in concurrencies])
    ax2.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax2.set(title="Tokens per target step (all steps)", ylabel="tokens / step")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    _save(fig, out)


def plot_speedup_map(results: dict, out: Path) -> None:
    """The speed-up map: method and draft length against concurrency, each cell the geometric mean of its
    speed-ups over sets and temperatures; the best cell of each concurrency framed."""
    plt = _pyplot()
    cells = _cells(results)
    rows = list(dict.fromkeys((m, c["k"]) for m, c in cells))
    concurrencies = results["concurrency"]
    values = [[next((figures(c)["speedup"] for m, c in cells if (m, c["k"], c["concurrency"]) == (method, k, at)),
                    None) for at in concurrencies] for method, k in rows]
    fig, ax = plt.subplots(figsize=(2.2 + 1.3 * len(concurrencies), 1.2 + 0.45 * max(1, len(rows))))
    grid = [[v if v is not None else float("nan") for v in row] for row in values]
    image = ax.imshow(grid or [[float("nan")]], cmap="RdYlGn", vmin=0.0, vmax=2.0, aspect="auto")
    for i, row in enumerate(values):
        for j, v in enumerate(row):
            ax.text(j, i, "–" if v is None else f"{v:.2f}×", ha="center", va="center", fontsize=9)
    for entry in results.get("serving", []):
        best = entry.get("best")
        if best and (best["method"], best["k"]) in rows:
            i, j = rows.index((best["method"], best["k"])), concurrencies.index(entry["concurrency"])
            ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=2))
    ax.set_xticks(range(len(concurrencies)), [str(c) for c in concurrencies])
    ax.set_yticks(range(len(rows)), [_row_name(m, k) for m, k in rows])
    ax.set(title="Speed-up over the target alone (geometric mean)", xlabel="concurrency")
    fig.colorbar(image, ax=ax, fraction=0.05)
    fig.tight_layout()
    _save(fig, out)


def plot_training(training: dict, out: Path) -> None:
    """Validation accuracy per draft step and simulated τ across epochs; the exported epoch marked."""
    plt = _pyplot()
    validation = training.get("validation", [])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    epochs = [e["epoch"] + 1 for e in validation]
    for key, label in step_accuracies(validation[0] if validation else {}):
        ax1.plot(epochs, [e[key] for e in validation], marker="o", label=label)
    ax1.set(title=f"{family_name(training)} validation accuracy", xlabel="epoch", ylabel="accuracy")
    ax1.legend()
    ax2.plot(epochs, [e.get("simulated_tau") for e in validation], marker="o", color="tab:purple")
    chosen = training.get("chosen", {}).get("epoch")
    if chosen is not None:
        ax2.axvline(chosen + 1, color="grey", linestyle="--", label=f"exported: epoch {chosen + 1}")
        ax2.legend()
    ax2.set(title="Simulated τ", xlabel="epoch", ylabel="τ")
    for ax in (ax1, ax2):
        ax.set_xticks(epochs)
    fig.tight_layout()
    _save(fig, out)


def family_name(record: dict) -> str:
    """The family a training summary or evaluation is of (runs from before families were EAGLE-3)."""
    return DISPLAY_NAME[record.get("family", DEFAULT_FAMILY)]


def plot_families(results: dict, out: Path) -> None:
    """Every trained family side by side at the pick's concurrency, each at its best draft length: τ and
    speed-up per prompt set and temperature."""
    plt = _pyplot()
    rows = results.get("families") or []
    served = [r for r in rows if r["served"] and r["runs"]]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    labels = [_label(r) for r in (served[0]["runs"] if served else [])]
    width = 0.8 / max(1, len(served))
    for i, row in enumerate(served):
        xs = [x - 0.4 + width / 2 + i * width for x in range(len(labels))]
        name = f"{DISPLAY_NAME[row['family']]} k={row['best']['k']}"
        ax1.bar(xs, [r["acceptance"]["tokens_per_step"] or 0 for r in row["runs"]], width, label=name)
        ax2.bar(xs, [r["speedup"] or 0 for r in row["runs"]], width, label=name)
    for ax, title, ylabel in ((ax1, "Tokens per target step", "tokens / step"),
                              (ax2, "Speed-up over the target alone", "× baseline tok/s")):
        ax.set_xticks(range(len(labels)), labels, rotation=20, fontsize=8)
        ax.set(title=f"{title} at concurrency {results['pick']['at']}", ylabel=ylabel)
        if served:
            ax.legend(fontsize=8)
    ax2.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    left_out = [f"{DISPLAY_NAME[r['family']]}: {r['excluded']}" for r in rows if not r["served"]]
    if left_out:
        fig.text(0.5, 0.01, "; ".join(left_out), ha="center", fontsize=8)
    fig.tight_layout()
    _save(fig, out)


def _families(results: dict) -> list[str]:
    """The side-by-side table of every trained family at the pick's concurrency, and the pick."""
    rows, chosen = results.get("families") or [], results["pick"]
    if not rows:
        return []
    lines = ["## Drafter families", "",
             f"**Picked: {DISPLAY_NAME[chosen['family']]}** by {FIGURES[chosen['by']]} at concurrency {chosen['at']}: "
             f"{chosen['why']}. Every family was trained from the same hidden states and vocabulary and measured "
             "on the same prompt sets, temperatures and concurrencies, each against the target alone in the same "
             "window; the others are in `results/drafters/{family}/`.", "",
             "| family | draft tokens | prompt set | T | τ (pooled) | tokens / step | acceptance by position | tok/s | "
             "speed-up | training time | drafter size |", "|---|---:|---|---:|---:|---:|---|---:|---:|---:|---:|"]
    for row in rows:
        size, train = f"{row['drafter_bytes'] / 2**20:.1f} MiB", _minutes(row["train_s"])
        name = DISPLAY_NAME[row["family"]] + (" ✔" if row["family"] == chosen["family"] else "")
        if not row["served"]:
            lines.append(f"| {name} | – | – | – | {row['excluded']} | – | {row['reason']} | – | – | {train} | {size} |")
        for run in row["runs"]:
            acc = run["acceptance"]
            per_pos = ", ".join(_fmt(r) for r in acc["acceptance_rate_per_position"])
            lines.append(f"| {name} | {row['best']['k']} | {run['set']} | {run['temperature']:g} | "
                         f"{_fmt(acc['tau_pooled'], '.3f')} | {_fmt(acc.get('tokens_per_step'), '.3f')} | {per_pos} | "
                         f"{_fmt(run['output_tok_s'], '.1f')} | {_fmt(run['speedup'], '.2f')}× | {train} | {size} |")
    return lines


def _serving(results: dict) -> list[str]:
    """The serving recipe: per concurrency, the best (method, draft length) of every one measured, the
    best trained drafter against the best training-free method, said plainly when the latter wins."""
    by = FIGURES[results["pick"]["by"]]
    asked = results["pick"].get("asked", results["pick"]["by"])
    lines = ["## Serving recipe", "",
             f"Per concurrency, every method at its best draft length and plain serving (the target alone), ranked "
             f"by {by} (geometric mean over prompt sets and temperatures for speed-ups). Tokens per target step "
             "count every step, so a training-free method that drafts only where it finds a match compares fairly "
             "with a drafter that always drafts. Each concurrency is the requests held in flight over the timed "
             "window (the evaluation table gives each run's mean).", "", *drain_note(results)]
    if asked != results["pick"]["by"]:
        lines += [f"Ranked by {by}, not {FIGURES[asked]} (evaluation.pick_by). {cpu_ranking_text()} "
                  f"{cpu_draft_length_text()}", ""]
    lines += [
              "| concurrency | best | draft tokens | speed-up | tokens / step | margin over next | best trained | "
              "best training-free | training bought (tokens / step) |", "|---:|---|---:|---:|---:|---|---|---|---:|"]
    plain = []
    for entry in results.get("serving", []):
        best = entry["best"]
        if best is None:
            lines.append(f"| {entry['concurrency']} | nothing measured | – | – | – | – | – | – | – |")
            continue
        runner = entry.get("runner_up")
        margin = f"{entry['margin']:+.1%} over {DISPLAY_NAME[runner['method']]} k={runner['k']}" if runner else "–"
        trained, free = entry["best_trained"], entry["best_training_free"]
        bought = entry.get("training_bought")
        lines.append(f"| {entry['concurrency']} | {DISPLAY_NAME[best['method']]} | {best['k']} | "
                     f"{_fmt(best['speedup'], '.2f')}× | {_fmt(best['tokens_per_step'], '.3f')} | {margin} | "
                     f"{_cell_name(trained)} | {_cell_name(free)} | "
                     f"{'–' if bought is None else f'{bought:+.1%}'} |")
        if entry.get("not_held"):  # ranked at what they delivered; results from before say nothing
            cells = "; ".join(f"{DISPLAY_NAME.get(n['method'], n['method'])} k={n['k']}: {n['why']}"
                              for n in entry["not_held"])
            plain.append(f"**At concurrency {entry['concurrency']}, "
                         + ("no method held the concurrency** (" if entry.get("nothing_held") else
                            "some cells did not hold it** (") + f"{cells}): ranked at what they delivered"
                         + ("; this band is unmeasured, and plain serving did not win it." if entry.get("nothing_held")
                            else "."))
        if entry.get("plain_wins"):
            plain.append(f"**At concurrency {entry['concurrency']}, plain serving (no speculation) is fastest**: "
                         "every method measured there slowed the target down; serve without speculation.")
        if entry["training_free_wins"]:
            plain.append(f"**At concurrency {entry['concurrency']}, {DISPLAY_NAME[free['method']]} (training-free, "
                         f"k={free['k']}) beats every trained drafter**: {by} {free['score']:.3f} against "
                         f"{trained['score']:.3f} for {DISPLAY_NAME[trained['method']]} k={trained['k']}.")
    return lines + [line for sentence in plain for line in ("", sentence)]


def _cell_name(cell: dict | None) -> str:
    if not cell:
        return "–"
    return (f"{DISPLAY_NAME[cell['method']]} k={cell['k']}: {_fmt(cell['speedup'], '.2f')}×, "
            f"{_fmt(cell['tokens_per_step'], '.3f')} tok/step")


def _minutes(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds / 60:.1f} min"


def _compute(choice: dict | None) -> str:
    """Which dtype a stage computed in, and why (see draftsmith.core.compute)."""
    return f" · computed in **{choice['dtype']}** ({choice['reason']})" if choice else ""


def _evaluation(results: dict) -> list[str]:
    methods = ", ".join(f"{DISPLAY_NAME[m]} ({'trained' if e.get('trained') else 'training-free'}"
                        + (f", not measured: {e.get('not_served') or e.get('failed')}" if not e.get("cells") else "")
                        + ")" for m, e in results["methods"].items())
    lines = [
        f"Target: `{results['target']}` · engine {results['engine']} · max_tokens {results['max_tokens']} · "
        f"concurrency {', '.join(map(str, results['concurrency']))} · methods: {methods}"
        + _compute(results.get("compute")), "",
        "τ is the **pooled** mean acceptance length per draft, 1 + accepted draft tokens / drafts, from the server's "
        "`/metrics` counter deltas; tokens / step is output tokens over target steps (all of them). Each method's "
        "speed-ups divide by the target alone at the same concurrency, set and temperature: "
        + _baselines(results["methods"]), "",
        "| method | draft tokens | concurrency | in flight (engine ran: mean, peak) | prompt set | T | prompts | "
        "τ (pooled) | tokens / step | "
        "acceptance by position | baseline tok/s | tok/s | speed-up |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---|---:|---:|---:|"]
    for row in evaluation_rows(results):
        held = "" if row["held"] else " not held"
        ran = (f" ({row['mean_running']:.1f}, {_fmt(row['peak_running'], 'g')})" if row["mean_running"] is not None
               else "")
        lines.append(f"| {row['method']} | {row['draft_tokens']} | {row['concurrency']} | "
                     f"{_fmt(row['mean_in_flight'], '.1f')}{ran}{held} | {row['prompt_set']} | "
                     f"{row['temperature']:g} | {row['prompts']} | {_fmt(row['tau_pooled'], '.3f')} | "
                     f"{_fmt(row['tokens_per_step'], '.3f')} | {row['acceptance_by_position']} | "
                     f"{_fmt(row['baseline_tok_s'], '.1f')} | {_fmt(row['tok_s'], '.1f')} | "
                     f"{_fmt(row['speedup'], '.2f')}× |")
    lines += ["", "In flight: the requests the client held over the timed window; engine ran: the engine's own count "
              "of running requests, its mean below the client's while a request waits to be admitted (a long "
              "prompt's prefill), its peak capped by a max_num_seqs or a KV cache smaller than the batch. "
              + f"{held_rule_text()} {readings_text(pick.measured_runs(results['methods']))}"]
    repeated = sorted({(r["prompt_set"], r["prompts"], r["concurrency"], r["repeats"]) for r in evaluation_rows(results)
                       if r["repeats"] and r["repeats"] > 1})
    if repeated:
        lines += ["", "A set is sent as at least two rounds of its concurrency, its prompts cycled in order, and timed "
                  "until fewer than the concurrency are in flight (the requests then running are cut): "
                  + "; ".join(f"{name} ({n} prompts) at concurrency {c} was sent {x:g}×" for name, n, c, x in repeated)
                  + ". The engine's prefix cache is off, so a repeated prompt pays its prefill again."]
    failed = [f"- {DISPLAY_NAME[m]} k={c['k']} at concurrency {c['concurrency']}: not measured, {c['failed']}"
              for m, e in results["methods"].items() for c in e.get("cells", []) if c.get("failed")]
    return lines + (["", "Cells not measured: their server failed, or a prompt set sent nothing (the others of the "
                         "grid were measured):", "", *failed] if failed else [])


def _training(training: dict, vocab: dict, gate: dict) -> list[str]:
    validation = training.get("validation", [])
    columns = step_accuracies(validation[0] if validation else {})
    chosen = training.get("chosen", {})
    hs = training.get("hidden_states", {})
    warm = training.get("warm_start")
    stored = {"fp8": ", stored in fp8 with a scale per token and layer", "bf16": ", stored in bf16"}.get(
        hs.get("storage"), "")  # runs from before storage was a choice stored bf16, unsaid
    layout = f" ({hs.get('layout')} layout{stored})" if hs.get("layout") else ""
    start = f" Warm start from `{warm['source']}` ({warm['layout']} layout)." if warm else " Trained from scratch."
    lines = ["## Drafter training", "",
             f"{training['rows']} rows (validation split included), run `{training['run_key']}`, speculators "
             f"{family_name(training)}"
             f"{' on CPU' if training['on_cpu'] else ''}{_compute(training.get('compute'))}; hidden states "
             f"**{hs.get('mode')}**{layout}, target layers {hs.get('aux_layers')}.{start}"
             + (f" {training['rows_without_hidden_states']} rows left out: their hidden-state extraction failed."
                if training.get("rows_without_hidden_states") else ""),
             "",
             f"Vocabulary mapping: {vocab['source']}; draft vocabulary {vocab['draft_vocab_size']} of "
             f"{vocab['target_vocab_size']}, covering {vocab['coverage']:.1%} of the supervised training tokens "
             f"(d2t sha256 `{vocab['d2t_sha256'][:12]}…`).", "",
             *_trainer(training), "",
             f"**Exported: {epoch_text(chosen.get('epoch'))}**: "
             f"{chosen.get('reason', '–')}. Export gate: {_gate(gate)}, {gate.get('verdict', '–')}.", "",
             "Validation per epoch. speculators' own figures: full_acc_k, the first k+1 drafted tokens all match "
             "the target's best token among the draft vocabulary, at every answer position, simulated τ = 1 + Σ "
             "full_acc_k; position_k_acc: position k of a drafted block matches, simulated τ = the mean accepted run "
             "per block + 1. draftsmith's: predicted served τ, the drafter replayed on the stored hidden states as a "
             "server drafts and verifies (from where the last step ended, against the target's token over its "
             "whole vocabulary), with and without the rows whose answers loop; training time: wall time from the "
             "start of training to that validation, the time to quality:", "",
             "| epoch | loss | " + " | ".join(label for _, label in columns) + " | simulated τ | predicted served τ "
             "| without looping rows | training time | exported |",
             "|---:|---:|" + "---:|" * len(columns) + "---:|---:|---:|---:|:---:|"]
    if not validation:
        lines.append("| – | no validation metrics were recorded | |")
    for e in validation:
        mark = "✔" if e["epoch"] == chosen.get("epoch") else ""
        predicted = e.get("predicted_served") or {}
        plain = predicted.get("without_looping_rows") or {}
        lines.append(f"| {e['epoch'] + 1} | {_fmt(e.get('loss_epoch'), '.3f')} | "
                     + " | ".join(_fmt(e.get(key), ".3f") for key, _ in columns)
                     + f" | {_fmt(e.get('simulated_tau'), '.3f')} | {_fmt(predicted.get('tokens_per_step'), '.3f')} | "
                     + (f"{_fmt(plain.get('tokens_per_step'), '.3f')} ({plain['rows']} of {predicted['rows']} rows)"
                        if plain else "–") + f" | {_minutes(e.get('train_s'))} | {mark} |")
    return lines + _predicted_basis(validation, chosen)


def _predicted_basis(validation: list[dict], chosen: dict) -> list[str]:
    """Under the epochs' table: what the predicted served τ is (exact or an estimate, at which draft length, and
    at each served one), or why there is none, as the training job recorded its choice (``chosen``, which
    ``./run.sh status`` formats too); a choice recorded before it held these: from the epochs' entries."""
    from draftsmith.training.train import predicted_missing, served_figure

    served = next((e["predicted_served"] for e in validation if e.get("predicted_served")), None)
    if served is None:
        why_not = chosen["predicted_missing"] if "predicted_missing" in chosen else \
            next(filter(None, map(predicted_missing, validation)), None)
        return ["", f"No predicted served τ: {why_not}; the simulated τ chose the checkpoint."] if why_not else []
    if chosen.get("predicted_served_tau") is not None:
        served = {**served, "k": chosen.get("k"), "exactness": chosen.get("exactness")}
    at = f" at k={served['k']}" if served.get("k") else ""
    disagree = ((served.get("exactness") or {}).get("agreement") or 1.0) < 1.0
    lines = ["", f"Predicted served τ{at}: {basis_text(served.get('exactness'))}"
             + (" (where a greedy answer's stored token is not the target's argmax, a near-tie between the engine "
                "and the replay or another engine's answer, the replay teacher-forces the drafter on it and walks "
                "it, where a server walks its own)" if disagree else "") + "."]
    if len(served.get("by_k") or {}) > 1:
        lines.append("Each served draft length's own walk (without looping rows): " + "; ".join(
            f"epoch {e['epoch'] + 1} " + ", ".join(f"k={k} {_fmt(served_figure(figures), '.3f')}"
                                                  for k, figures in e["predicted_served"]["by_k"].items())
            for e in validation if (e.get("predicted_served") or {}).get("by_k")) + ".")
    return lines


def _gate(gate: dict) -> str:
    if gate.get("served") is False:
        return "not served here"
    return "passed" if gate.get("passed") else "FAILED"


PHASES = [("launch_s", "launch"), ("build_s", "model and data built"), ("first_step_s", "first step"),
          ("compile_s", "of which compiling"), ("first_validation_s", "first validation"),
          ("done_s", "work done"), ("exit_s", "processes exited after")]


def _trainer(training: dict) -> list[str]:
    """The loss implementation and compilation chosen, and where the training job's time went."""
    choice, phases = training.get("trainer"), training.get("phases") or {}
    if not choice:  # a run from before the choice was recorded
        return []
    lines = [f"Loss computed **{choice['loss_implementation']}**, forward "
             f"{'compiled' if choice['compile'] else 'not compiled'} ({choice['reason']}).", "",
             "Where the training job's time went (seconds from the trainer's start; one-time costs apart from "
             "the steady pace):", "", "| phase | seconds |", "|---|---:|"]
    lines += [f"| {name} | {phases[key]:.1f} |" for key, name in PHASES if phases.get(key) is not None]
    if phases.get("steps_per_s"):
        lines.append(f"| steady pace | {phases['steps_per_s']:.2f} steps/s |")
    return lines


def _data(prompt_stats: dict[str, dict], merge_stats: dict) -> list[str]:
    lines = ["## Training data", "",
             "Prompts dropped before generation: `exact` or `ngram` match an evaluation prompt, `duplicate` of an "
             "earlier prompt. Rows and supervised tokens after the split and the mixture weights.", "",
             "| dataset | rows read | rejected | kept prompts | exact | ngram | duplicate | weight | train rows | "
             "validation rows | train supervised tokens |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, mix in merge_stats["datasets"].items():
        st = prompt_stats.get(name, {})
        dropped = st.get("dropped", {})
        read = f"{st.get('rows_read', '–')} | {st.get('rejected_rows', '–')} | {st.get('kept', '–')}"
        lines.append(f"| {name} | {read} | "
                     f"{dropped.get('exact', 0)} | {dropped.get('ngram', 0)} | {dropped.get('duplicate', 0)} | "
                     f"{mix['weight']} | {mix['train_rows']} | {mix['validation_rows']} | "
                     f"{mix['train_supervised_tokens']} |")
    examples = [(n, e) for n, st in prompt_stats.items() for e in st.get("examples", [])][:8]
    if examples:
        lines += ["", "Examples of dropped prompts:", ""]
        lines += [f"- {n} `{e['id']}` ({e['reason']}, matches `{e['matches']}`, overlap {e['overlap']}): "
                  f"{e['prompt'][:100]!r}" for n, e in examples]
    return lines


def _repetition(tokenized: dict[str, dict] | None) -> list[str]:
    """Each dataset's looping answers: the distribution of its rows' looping share (the repeated span,
    :func:`~draftsmith.data.repetition.looping_share`), the rows a limit would drop, and those dropped. Datasets
    tokenized before the span was measured show their 4-gram share as it was recorded."""
    stats = (tokenized or {}).items()
    spans = {name: st["looping"] for name, st in stats if st.get("looping", {}).get("rows")}
    ngrams = {name: st["repetition"] for name, st in stats if st.get("repetition", {}).get("rows")}
    if not spans and not ngrams:  # tokenized before repetition was measured: none
        return []
    lines = ["## Looping answers", "",
             "A looping answer is easy to predict: validation rewards it and traffic does not loop. Rows above a "
             "share are what a limit there would drop (generated datasets; pre-tokenized ones are not measured)."]
    if spans:
        lines += ["", looping_text(next(iter(spans.values()))), "", *_share_table(spans, "tokenize.max_looping")]
    if ngrams:
        first = next(iter(ngrams.values()))
        lines += ["", f"Share of each answer's positions whose last {first['ngram']} tokens already occurred earlier "
                      "in it (the 4-gram share, which long code and logs reach too), as recorded:", "",
                  *_share_table(ngrams, "tokenize.max_repetition")]
    return lines


def _share_table(measured: dict[str, dict], key: str) -> list[str]:
    """Per dataset: its shares' distribution, the rows above each threshold, and what ``key`` dropped."""
    thresholds = list(next(iter(measured.values()))["above"])
    lines = ["| dataset | rows | mean | p50 | p90 | max | " + " | ".join(f"> {t}" for t in thresholds)
             + f" | dropped by `{key}` |", "|---|---:|---:|---:|---:|---:|" + "---:|" * len(thresholds) + "---:|"]
    for name, rep in measured.items():
        dropped = f"{rep['dropped']} (limit {rep['limit']:g})" if rep.get("limit") is not None else "– (no limit)"
        lines.append(f"| {name} | {rep['rows']} | {rep['mean']:.3f} | {rep['p50']:.3f} | {rep['p90']:.3f} | "
                     f"{rep['max']:.3f} | " + " | ".join(str(rep["above"].get(t, "–")) for t in thresholds)
                     + f" | {dropped} |")
    return lines


def _generation(generation_stats: dict[str, dict]) -> list[str]:
    """Per dataset: what regeneration kept, failed, retried, truncated and dropped, and the conversations ended
    where their next prompt would not fit the target's context (``–`` in stats from before that was counted)."""
    lines = ["## Response generation", "",
             "| dataset | records | errors | retries | truncated kept | dropped | ended at the context (dropped) | "
             "with reasoning | completion tokens | p50 s | p95 s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, st in generation_stats.items():
        context = f"{st['ends_at_context']} ({st['dropped_context']})" if "ends_at_context" in st else "–"
        lines.append(f"| {name} | {st['records']} | {st['errors']} | {st['retries']} | "
                     f"{st['truncated_kept']} | {st['dropped_truncated']} | {context} | {st['reasoning_records']} | "
                     f"{st['completion_tokens']} | {_fmt(st['latency_p50_s'])} | {_fmt(st['latency_p95_s'])} |")
    return lines


TOKEN_SOURCE = {"model": "the model's own ids", "template": "the template's rendering"}


def _tool_data(generation_stats: dict[str, dict], tokenized: dict[str, dict] | None) -> list[str]:
    """Per generated dataset with tools: the conversations and calls regenerated, the conversations cut (by
    reason), ended at a call where the data ends and ended with fewer calls than the dataset made, the calls
    answered by name alone (semi-on-policy), the supervised tokens of the turns that called tools, and where the
    calls' tokens came from. Datasets without tools, and stats from before tools, none."""
    names = [n for n, st in generation_stats.items()
             if st.get("rows_with_tools") or ((tokenized or {}).get(n) or {}).get("tools", {}).get("rows_with_tools")]
    if not names:
        return []
    lines = ["## Tool-call data", "",
             "Rows with tools regenerated with their tools sent on every request, each of the model's calls paired "
             "with the dataset's result of its name and arguments; a call that cannot be paired cuts the conversation "
             "there (its turn kept), a call where the data has nothing after it (no result, no later turn) ends the "
             "conversation uncut, and a stretch the model ended with fewer calls than the dataset made is a natural "
             "end, counted apart. "
             "Supervised tokens in calling turns: whole assistant turns that made calls (the calls' markup and any "
             "text beside it); a tool result is never supervised.", "",
             "| dataset | rows with tools | tool calls regenerated | conversations cut (by reason) | "
             "ends at a call | fewer-calls ends | results by name (semi-on-policy) | "
             "supervised tokens in calling turns | tool-result tokens supervised | tool-call tokens from |",
             "|---|---:|---:|---|---:|---:|---:|---:|---:|---|"]
    for name in names:
        st, tools = generation_stats[name], ((tokenized or {}).get(name) or {}).get("tools") or {}
        rows, cuts = st.get("rows_with_tools", 0), st.get("cuts_by_reason") or {}
        sources = st.get("tool_call_token_source") or {}
        source = ", ".join(f"{TOKEN_SOURCE.get(k, k)} ({n})" for k, n in sources.items())
        lines.append(f"| {name} | {rows} | {st.get('tool_calls', '–')} | {_cuts(cuts, rows)} | "
                     f"{st.get('ends_at_call', '–')} | {st.get('fewer_calls', '–')} | "
                     f"{st.get('results_by_name', '–')} | {tools.get('tool_call_tokens', '–')} | "
                     f"{tools.get('tool_result_tokens_supervised', '–')} | "
                     f"{source or '–'} |")
    if any(generation_stats[n].get("results_by_name") for n in names):
        lines += ["", "Results by name (`unmatched_calls: by_name`): calls answered with the dataset's result of "
                      "their function although the dataset called it with other arguments; the turns after them are "
                      "semi-on-policy (the model read a result it did not ask for)."]
    if any(generation_stats[n].get("unparsed_call_markup") for n in names):
        lines += ["", "Some conversations hold a turn whose text has the tool-call parser's markup and no call was "
                      "read from it (" + ", ".join(f"{n}: {generation_stats[n]['unparsed_call_markup']}" for n in names
                                                   if generation_stats[n].get("unparsed_call_markup"))
                  + "): check target.tool_call_parser."]
    lines += _executed_lines({n: generation_stats[n] for n in names if "executed_steps" in generation_stats[n]})
    rerendered = {n: ((tokenized or {}).get(n) or {}).get("tools", {}).get("per_turn_rerendered") for n in names}
    if any(rerendered.values()):
        lines += ["", "Conversations tokenized one row per turn though the layout is whole (" + ", ".join(
            f"{n}: {k}" for n, k in rerendered.items() if k) + "): the template renders an earlier call otherwise "
                  "than the model wrote it, and the server saw the template's rendering."]
    if any((st.get("tool_call_token_source") or {}).get("template") for st in generation_stats.values()):
        lines += ["", "A hosted API returns text: the calls' tokens are the template's rendering of the calls the API "
                      "returned, not the ids the model sampled."]
    return lines


def _executed_lines(executed: dict[str, dict]) -> list[str]:
    """The sets whose calls ran on their rows' own instances (BFCL multi-turn, ``unmatched_calls: execute``): steps,
    calls made against the ground truth's, execution errors by reason, and every row whose set-up failed, named."""
    if not executed:
        return []
    lines = ["", "Calls run live on each row's own instances of BFCL's classes (`unmatched_calls: execute`), their "
                 "results or BFCL's error texts returned to the target:", "",
             "| dataset | steps | calls made | calls in the ground truth | execution errors (by reason) | "
             "rows whose set-up failed |", "|---|---:|---:|---:|---|---|"]
    for name, st in executed.items():
        errors = st.get("execution_errors_by_reason") or {}
        named = ", ".join(st.get("setup_failed_ids") or [])
        lines.append(f"| {name} | {st['executed_steps']} | {st['calls_made']} | {st['calls_expected']} | "
                     f"{_cuts(errors, 0)} | {st.get('setup_failed', 0)}{f' ({named})' if named else ''} |")
    return lines


def _cuts(cuts: dict[str, int], rows: int) -> str:
    """Conversations cut, their share of the rows with tools and each reason's count: ``3 (30%: other
    function 2, parallel calls 1)``."""
    total = sum(cuts.values())
    if not total:
        return "0"
    reasons = ", ".join(f"{reason.replace('_', ' ')} {n}" for reason, n in sorted(cuts.items()))
    return f"{total} ({total / rows:.0%}: {reasons})" if rows else f"{total} ({reasons})"


def derived_lengths(results: dict) -> list[str]:
    """The pick's derived tokens per step at shorter draft lengths (:func:`pick.derived_lengths`), beside the cells
    the grid measured at those lengths."""
    rows = [f"| {DISPLAY_NAME[row['method']]} | {row['concurrency']} | {row['k']} | {row['derived']:.3f} | "
            f"{_fmt(row['measured'], '.3f')} |" for row in pick.recorded(results, "derived_lengths")]
    if not rows:
        return []
    return ["## Shorter draft lengths, derived", "",
            "At T=0 a chain method's first k drafts are the same at any longer draft length, so the longest length "
            "measured says what each shorter one accepts: tokens per step derived from its acceptance by position "
            "(over the steps the longest length took: an estimate), beside the cells measured at that length. "
            "Speed-ups are not derived: a shorter length drafts less per step and its cost must be measured.", "",
            "| method | concurrency | draft tokens | derived tokens / step (T=0) | measured |",
            "|---|---:|---:|---:|---:|", *rows]


def gate_tables(gates: dict[str, dict] | None) -> list[str]:
    """Every family's gate: served acceptance by position against the drafter replayed on the same rows and
    window."""
    tables = [(family, table) for family, gate in (gates or {}).items() if (table := gate_table(gate))]
    if not tables:
        return []
    first = gates[tables[0][0]]
    thresholds = thresholds_of(first)
    lines = ["## Served against predicted, by position", "",
             "At the export gate, each family served the first turns of validation rows (up to "
             f"{gate_window(first)} tokens each), and the same drafter was replayed on the stored "
             "hidden states of those rows and window, walked as a server drafts and verifies (a block family's "
             f"block from each anchor in one forward). {flag_rule_text(thresholds)}: the engine accepts otherwise "
             "there than the drafter does (its attention, rope or a later step's inputs differ from training), or the "
             "served answers are not the stored ones (numerics: the prediction is then an estimate, said with its "
             "agreement share). Rows whose answers were sampled are served sampled alike: each side is then one "
             f"sample of the same acceptance, and a gap within {thresholds['sampled_z']:g} standard errors of their "
             "difference, rows as the unit, is not flagged. "
             "DSpark: an engine whose confidence head cuts a block short accepts less at the later "
             "positions than the replay, which drafts the whole block."]
    for family, table in tables:
        own = thresholds_of(gates[family])  # a family gated again since, by other thresholds, says its own
        said = "" if own == thresholds else f" {flag_rule_text(own)} at its gate."
        lines += ["", f"{DISPLAY_NAME[family]}:{said}", "", *table]
    return lines


def _section(lines: list[str]) -> list[str]:
    return [*lines, ""] if lines else []


def schedule_section(inputs: Inputs) -> list[str]:
    """The published method's one config for every batch size, and, where its draft length changes with the
    batch, what it measured served as one beside each concurrency's best fixed cell."""
    if not inputs.serving:
        return []
    plan = inputs.serving["schedule"]
    lines = ["## One config for every batch size", "", one_config_text(plan, inputs.results.get("serving", [])), "",
             f"{DISPLAY_NAME[plan['family']]}'s schedule ({plan['kind']}): {describe_bands(plan)}; "
             "`results/drafter/serving.json` holds the vLLM config."]
    if plan["kind"] == "dynamic":
        lines += ["", *schedule_table(inputs.serving.get("measured") or {}, inputs.results)]
    return lines


def _with_plot(section: list[str], image: str) -> list[str]:
    return [*section, "", image, ""] if section else []


def markdown(inputs: Inputs, plot_name: str, training_plot_name: str, families_plot_name: str,
             speedup_map_name: str) -> str:
    lines = ["# draftsmith report", "", *_serving(inputs.results), "",
             *_section(recipe_by_workload(inputs.results, inputs.workloads)),
             *_section(schedule_section(inputs)),
             *_section(gate_tables(inputs.gates)),
             *_section(load_changed(inputs.results)),
             f"![speed-up map]({speedup_map_name})", "", *_evaluation(inputs.results), "",
             *_section(tool_calls(inputs.results, inputs.workloads)),
             *_section(derived_lengths(inputs.results)),
             f"![acceptance and tokens per step]({plot_name})", "",
             *_with_plot(_families(inputs.results), f"![drafter families]({families_plot_name})"),
             *_training(inputs.training, inputs.vocab, inputs.gate), "", f"![training]({training_plot_name})", "",
             *_data(inputs.prompts, inputs.merge), "", *_generation(inputs.generation), "",
             *_section(_tool_data(inputs.generation, inputs.tokenized)),
             *_section(_repetition(inputs.tokenized))]
    if not inputs.results.get("on_accelerator"):
        lines += [cpu_ranking_text(), ""]
    return "\n".join(lines)


def evaluation_rows(results: dict) -> list[dict]:
    """The evaluation table, one row per method, draft length, concurrency, prompt set, temperature and
    drafter (a warm start's pretrained drafter beside the trained one), for Snakemake's report too."""
    rows = []
    for method, evaluation in results["methods"].items():
        for cell in evaluation.get("cells", []):
            name = DISPLAY_NAME[method] + ("" if cell["drafter"] in ("finetuned", method) else f" ({cell['drafter']})")
            for run in cell["runs"]:
                acc = run["acceptance"]
                rows.append({"method": name, "draft_tokens": cell["k"], "concurrency": cell["concurrency"],
                             "prompt_set": run["set"], "temperature": run["temperature"], "prompts": run["prompts"],
                             "tau_pooled": acc["tau_pooled"], "tokens_per_step": acc.get("tokens_per_step"),
                             "acceptance_by_position": ", ".join(_fmt(r) for r in acc["acceptance_rate_per_position"]),
                             "baseline_tok_s": run["baseline_tok_s"], "tok_s": run["output_tok_s"],
                             "speedup": run["speedup"], "mean_in_flight": run.get("mean_in_flight"),
                             "mean_running": run.get("mean_running"), "peak_running": run.get("peak_running"),
                             "held": run.get("held", True),
                             "repeats": run.get("repeats")})
    return rows


def write_report(inputs: Inputs, md_out: Path, png_out: Path, training_png_out: Path, families_png_out: Path,
                 speedup_map_out: Path, tsv_out: Path) -> None:
    import csv
    import io

    rows = evaluation_rows(inputs.results)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]) if rows else ["method"], delimiter="\t")
    writer.writeheader()
    writer.writerows(rows)
    write_text(tsv_out, buffer.getvalue())
    plot(inputs.results, png_out)
    plot_speedup_map(inputs.results, speedup_map_out)
    plot_training(inputs.training, training_png_out)
    plot_families(inputs.results, families_png_out)
    write_text(md_out, markdown(inputs, png_out.name, training_png_out.name, families_png_out.name,
                                speedup_map_out.name))


def training_free_markdown(evaluations: dict[str, dict], serving: list[dict], pick_by: str) -> str:
    """The training-free methods alone: per concurrency their best setting, and every cell measured."""
    first = next(iter(evaluations.values()))
    results = {"methods": evaluations, "serving": serving, "pick": {"by": pick_by}, "target": first["target"],
               "engine": first["engine"], "max_tokens": first["max_tokens"], "concurrency": first["concurrency"],
               "compute": first.get("compute")}
    lines = ["# Training-free speculation on this target", "",
             "No hidden states and no training: vLLM's own speculation from the prompt and the answer so far, "
             "measured against the target alone in the same window. A trained drafter has to beat these.", "",
             *_serving(results), "", *_evaluation(results), ""]
    return "\n".join(lines)
