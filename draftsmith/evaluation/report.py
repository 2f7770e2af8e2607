"""The report: a Markdown page and PNG plots from the evaluation results and every stage's stats."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from draftsmith.core.atomic import atomic_path, write_text
from draftsmith.training.families import DEFAULT_FAMILY, DISPLAY_NAME, step_accuracies


@dataclass
class Inputs:
    results: dict
    generation: dict[str, dict]
    prompts: dict[str, dict]
    merge: dict
    vocab: dict
    training: dict
    gate: dict


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


def plot(results: dict, out: Path) -> None:
    """Acceptance by draft position per set and drafter, and throughput against the baseline."""
    plt = _pyplot()
    runs = results["runs"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    positions = 0
    for run in runs:
        for label, measured in run["drafters"].items():
            rates = measured["acceptance"]["acceptance_rate_per_position"]
            positions = max(positions, len(rates))
            ax1.plot(range(1, len(rates) + 1), rates, marker="o", label=f"{_label(run)} · {label}")
    ax1.set_xticks(range(1, positions + 1))
    ax1.set(title="Draft acceptance rate by position", xlabel="draft position", ylabel="accepted / drafts",
            ylim=(0, 1))
    ax1.legend(fontsize=7)
    drafters = list(results["drafters"])
    width = 0.8 / (1 + len(drafters))
    xs = range(len(runs))
    ax2.bar([x - 0.4 + width / 2 for x in xs], [r["baseline"]["output_tok_s"] or 0 for r in runs], width,
            label="baseline")
    for i, label in enumerate(drafters, start=1):
        ax2.bar([x - 0.4 + width / 2 + i * width for x in xs],
                [r["drafters"][label]["output_tok_s"] or 0 for r in runs], width,
                label=f"{family_name(results)} {label}")
    ax2.set_xticks(list(xs), [_label(r) for r in runs], rotation=20, fontsize=8)
    ax2.set(title="Output throughput", ylabel="output tok/s")
    ax2.legend(fontsize=8)
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
    """Every trained family side by side: τ and speed-up per prompt set and temperature."""
    plt = _pyplot()
    rows = results.get("families") or []
    served = [r for r in rows if r["served"]]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    labels = [_label(r) for r in (served[0]["runs"] if served else [])]
    width = 0.8 / max(1, len(served))
    for i, row in enumerate(served):
        xs = [x - 0.4 + width / 2 + i * width for x in range(len(labels))]
        ax1.bar(xs, [r["tau"] or 0 for r in row["runs"]], width, label=DISPLAY_NAME[row["family"]])
        ax2.bar(xs, [r["speedup"] or 0 for r in row["runs"]], width, label=DISPLAY_NAME[row["family"]])
    for ax, title, ylabel in ((ax1, "Acceptance length τ (pooled)", "τ"), (ax2, "Speed-up over the target alone",
                                                                           "× baseline tok/s")):
        ax.set_xticks(range(len(labels)), labels, rotation=20, fontsize=8)
        ax.set(title=title, ylabel=ylabel)
        if served:
            ax.legend(fontsize=8)
    ax2.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    unserved = [f"{DISPLAY_NAME[r['family']]}: not served here" for r in rows if not r["served"]]
    if unserved:
        fig.text(0.5, 0.01, "; ".join(unserved), ha="center", fontsize=8)
    fig.tight_layout()
    _save(fig, out)


def _families(results: dict) -> list[str]:
    """The side-by-side table of every trained family, and the pick."""
    rows, chosen = results.get("families") or [], results.get("pick") or {}
    if not rows:
        return []
    by = "speed-up" if chosen.get("by") == "speedup" else "τ"
    lines = ["## Drafter families", "",
             f"**Picked: {DISPLAY_NAME[chosen['family']]}** by {by}: {chosen['why']}. Every family was trained from "
             "the same hidden states and vocabulary and measured on the same prompt sets, temperatures and "
             "concurrency; the others are in `results/drafters/{family}/`.", "",
             "| family | prompt set | T | drafts/step | τ (pooled) | acceptance by position | tok/s | speed-up | "
             "training time | drafter size |", "|---|---|---:|---:|---:|---|---:|---:|---:|---:|"]
    for row in rows:
        size, train = f"{row['drafter_bytes'] / 2**20:.1f} MiB", _minutes(row["train_s"])
        name = DISPLAY_NAME[row["family"]] + (" ✔" if row["family"] == chosen["family"] else "")
        if not row["served"]:
            lines.append(f"| {name} | – | – | – | not served here | {row['reason']} | – | – | {train} | {size} |")
        for run in row["runs"]:
            per_pos = ", ".join(_fmt(r) for r in run["acceptance_rate_per_position"])
            lines.append(f"| {name} | {run['set']} | {run['temperature']:g} | {row['num_speculative_tokens']} | "
                         f"{_fmt(run['tau'], '.3f')} | {per_pos} | {_fmt(run['output_tok_s'], '.1f')} | "
                         f"{_fmt(run['speedup'], '.2f')}× | {train} | {size} |")
    return lines


def _minutes(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds / 60:.1f} min"


def _compute(choice: dict | None) -> str:
    """Which dtype a stage computed in, and why (see draftsmith.core.compute)."""
    return f" · computed in **{choice['dtype']}** ({choice['reason']})" if choice else ""


def _evaluation(results: dict) -> list[str]:
    lines = [
        f"Target: `{results['target']}` · engine {results['engine']} · {results['num_speculative_tokens']} "
        f"speculative tokens · max_tokens {results['max_tokens']} · concurrency {results['concurrency']} · "
        "drafters: " + ", ".join(f"{k} `{v}`" for k, v in results["drafters"].items())
        + _compute(results.get("compute")), "",
        "τ is the **pooled** mean acceptance length, 1 + accepted draft tokens / drafts over every draft "
        f"of the set, from the {family_name(results)} server's `/metrics` counter deltas.", "",
        "| prompt set | T | prompts | drafter | τ (pooled) | acceptance by position | baseline tok/s | "
        "drafter tok/s | speed-up |", "|---|---:|---:|---|---:|---|---:|---:|---:|"]
    for run in results["runs"]:
        for label, measured in run["drafters"].items():
            acc = measured["acceptance"]
            per_pos = ", ".join(_fmt(r) for r in acc["acceptance_rate_per_position"])
            base = _fmt(run["baseline"]["output_tok_s"], ".1f")
            lines.append(f"| {run['set']} | {run['temperature']:g} | {run['prompts']} | {label} | "
                         f"{_fmt(acc['tau_pooled'], '.3f')} | {per_pos} | {base} | "
                         f"{_fmt(measured['output_tok_s'], '.1f')} | {_fmt(measured['speedup'], '.2f')}× |")
    return lines


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
    exported = chosen["epoch"] + 1 if chosen.get("epoch") is not None else None
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
             f"**Exported: epoch {_fmt(exported, 'd')}** "
             f"({chosen.get('reason', '–')}). Export gate: {_gate(gate)}, {gate.get('verdict', '–')}.", "",
             "Validation per epoch (full_acc_k: the first k+1 drafted tokens all match the target, simulated "
             "τ = 1 + Σ full_acc_k; position_k_acc: position k of a drafted block matches, simulated τ = the mean "
             "accepted run per block + 1; training time: wall time from the start of training to that validation, "
             "the time to quality):", "",
             "| epoch | loss | " + " | ".join(label for _, label in columns) + " | simulated τ | training time "
             "| exported |",
             "|---:|---:|" + "---:|" * len(columns) + "---:|---:|:---:|"]
    if not validation:
        lines.append("| – | no validation metrics were recorded | |")
    for e in validation:
        mark = "✔" if e["epoch"] == chosen.get("epoch") else ""
        lines.append(f"| {e['epoch'] + 1} | {_fmt(e.get('loss_epoch'), '.3f')} | "
                     + " | ".join(_fmt(e.get(key), ".3f") for key, _ in columns)
                     + f" | {_fmt(e.get('simulated_tau'), '.3f')} | {_minutes(e.get('train_s'))} | {mark} |")
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


def _generation(generation_stats: dict[str, dict]) -> list[str]:
    lines = ["## Response generation", "",
             "| dataset | records | errors | retries | truncated kept | dropped | with reasoning | completion tokens | "
             "p50 s | p95 s |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, st in generation_stats.items():
        lines.append(f"| {name} | {st['records']} | {st['errors']} | {st['retries']} | "
                     f"{st['truncated_kept']} | {st['dropped_truncated']} | {st['reasoning_records']} | "
                     f"{st['completion_tokens']} | {_fmt(st['latency_p50_s'])} | {_fmt(st['latency_p95_s'])} |")
    return lines


def _with_plot(section: list[str], image: str) -> list[str]:
    return [*section, "", image, ""] if section else []


def markdown(inputs: Inputs, plot_name: str, training_plot_name: str, families_plot_name: str) -> str:
    lines = ["# draftsmith report", "", *_evaluation(inputs.results), "",
             f"![acceptance and throughput]({plot_name})", "", *_with_plot(_families(inputs.results),
                                                                         f"![drafter families]({families_plot_name})"),
             *_training(inputs.training, inputs.vocab, inputs.gate), "", f"![training]({training_plot_name})", "",
             *_data(inputs.prompts, inputs.merge), "", *_generation(inputs.generation), ""]
    if not inputs.results.get("on_accelerator"):
        lines += ["Measured on a CPU: there the figure of merit is τ, as drafting costs about as much as the "
                  "target's own step and no speed-up is expected; speed-up needs a GPU.", ""]
    return "\n".join(lines)


def evaluation_rows(results: dict) -> list[dict]:
    """The evaluation table, one row per prompt set, temperature and drafter (for Snakemake's report)."""
    rows = []
    for run in results["runs"]:
        for label, measured in run["drafters"].items():
            acc = measured["acceptance"]
            rows.append({"prompt_set": run["set"], "temperature": run["temperature"], "prompts": run["prompts"],
                         "drafter": label, "tau_pooled": acc["tau_pooled"],
                         "acceptance_by_position": " ".join(f"{r:.3f}" for r in acc["acceptance_rate_per_position"]),
                         "baseline_tok_s": run["baseline"]["output_tok_s"], "drafter_tok_s": measured["output_tok_s"],
                         "speedup": measured["speedup"]})
    return rows


def write_report(inputs: Inputs, md_out: Path, png_out: Path, training_png_out: Path, families_png_out: Path,
                 tsv_out: Path) -> None:
    import csv
    import io

    rows = evaluation_rows(inputs.results)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]) if rows else ["prompt_set"], delimiter="\t")
    writer.writeheader()
    writer.writerows(rows)
    write_text(tsv_out, buffer.getvalue())
    plot(inputs.results, png_out)
    plot_training(inputs.training, training_png_out)
    plot_families(inputs.results, families_png_out)
    write_text(md_out, markdown(inputs, png_out.name, training_png_out.name, families_png_out.name))
