"""The benchmark report: a Markdown page and PNG plots from the benchmark JSON."""

from __future__ import annotations

from pathlib import Path

from draftsmith.atomic import atomic_path, write_text


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


def plot(results: dict, out: Path) -> None:
    plt = _pyplot()

    sets = list(results["sets"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for name in sets:
        rates = results["sets"][name]["eagle3"]["acceptance"]["acceptance_rate_per_position"]
        ax1.plot(range(1, len(rates) + 1), rates, marker="o", label=name)
    positions = max((len(results["sets"][s]["eagle3"]["acceptance"]["acceptance_rate_per_position"]) for s in sets),
                    default=0)
    ax1.set_xticks(range(1, positions + 1))
    ax1.set(title="Draft acceptance rate by position", xlabel="draft position", ylabel="accepted / drafts",
            ylim=(0, 1))
    ax1.legend()
    width = 0.38
    xs = range(len(sets))
    base = [results["sets"][s]["baseline"]["output_tok_s"] or 0 for s in sets]
    eagle = [results["sets"][s]["eagle3"]["output_tok_s"] or 0 for s in sets]
    ax2.bar([x - width / 2 for x in xs], base, width, label="baseline")
    ax2.bar([x + width / 2 for x in xs], eagle, width, label="EAGLE-3")
    ax2.set_xticks(list(xs), sets)
    ax2.set(title="Output throughput", ylabel="output tok/s")
    ax2.legend()
    fig.tight_layout()
    _save(fig, out)


def ttt_steps(epochs: list[dict]) -> list[int]:
    return sorted(int(k.split("_")[2]) for k in (epochs[0] if epochs else {}) if k.startswith("full_acc_"))


def plot_training(validation: list[dict], out: Path) -> None:
    """Validation accuracy per TTT step (draft position) across epochs."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    epochs = [e["epoch"] + 1 if e.get("epoch") is not None else i + 1 for i, e in enumerate(validation)]
    ax.set_xticks(epochs)
    for step in ttt_steps(validation):
        ax.plot(epochs, [e[f"full_acc_{step}_epoch"] for e in validation], marker="o", label=f"step {step}")
    ax.set(title="Drafter validation accuracy", xlabel="epoch", ylabel="full_acc (prefix all correct)")
    ax.legend()
    fig.tight_layout()
    _save(fig, out)


def markdown(results: dict, generation_stats: dict[str, dict], training: dict, plot_name: str,
             training_plot_name: str) -> str:
    lines = [
        "# draftsmith benchmark report", "",
        f"Target: `{results['target']}` · drafter: `{results['drafter']}` · "
        f"{results['num_speculative_tokens']} speculative tokens · temperature {results['temperature']} · "
        f"max_tokens {results['max_tokens']} · concurrency {results['concurrency']}", "",
        "τ is the **pooled** mean acceptance length, 1 + accepted draft tokens / drafts over every draft "
        "of the set, from the EAGLE-3 server's `/metrics` counter deltas.", "",
        "| prompt set | prompts | τ (pooled) | acceptance by position | baseline tok/s | EAGLE-3 tok/s | speed-up |",
        "|---|---:|---:|---|---:|---:|---:|",
    ]
    for name, res in results["sets"].items():
        acc = res["eagle3"]["acceptance"]
        per_pos = ", ".join(_fmt(r) for r in acc["acceptance_rate_per_position"])
        lines.append(f"| {name} | {res['prompts']} | {_fmt(acc['tau_pooled'], '.3f')} | {per_pos} | "
                     f"{_fmt(res['baseline']['output_tok_s'], '.1f')} | {_fmt(res['eagle3']['output_tok_s'], '.1f')} | "
                     f"{_fmt(res['speedup'], '.2f')}× |")
    dropped = {n: r["decontaminated_ids"] for n, r in results["sets"].items() if r["decontaminated_ids"]}
    lines += ["", f"![acceptance and throughput]({plot_name})", ""]
    if dropped:
        lines += ["Benchmark prompts removed because they also appear in the training prompts: "
                  + "; ".join(f"{n}: {', '.join(ids)}" for n, ids in dropped.items()), ""]
    validation = training.get("validation", [])
    steps = ttt_steps(validation)
    lines += ["## Drafter training", "",
              f"{training['rows']} training rows (validation split included), run `{training['run_key']}`, "
              f"speculators EAGLE-3{' on CPU' if training['on_cpu'] else ''}. Validation per epoch "
              "(full_acc_k: the first k+1 drafted tokens all match the target):", "",
              "| epoch | loss | " + " | ".join(f"full_acc_{k}" for k in steps) + " |",
              "|---:|---:|" + "---:|" * len(steps)]
    if not validation:
        lines.append("| – | no validation metrics were recorded | |")
    for i, e in enumerate(validation):
        lines.append(f"| {i + 1} | {_fmt(e.get('loss_epoch'), '.3f')} | "
                     + " | ".join(_fmt(e.get(f"full_acc_{k}_epoch"), ".3f") for k in steps) + " |")
    lines += ["", f"![training]({training_plot_name})", ""]
    lines += ["## Response generation", "",
              "| dataset | records | rejected rows | errors | retries | truncated kept | dropped | completion tokens | "
              "p50 s | p95 s |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, st in generation_stats.items():
        lines.append(f"| {name} | {st['records']} | {st['rejected_rows']} | {st['errors']} | {st['retries']} | "
                     f"{st['truncated_kept']} | {st['dropped_truncated']} | {st['completion_tokens']} | "
                     f"{_fmt(st['latency_p50_s'])} | {_fmt(st['latency_p95_s'])} |")
    lines += ["", "On a CPU with a 135M target the figure of merit is τ: drafting costs as much as the target's "
              "own step there, so no speed-up is expected; speed-up needs a GPU and a large target.", ""]
    return "\n".join(lines)


def write_report(results: dict, generation_stats: dict[str, dict], training: dict, md_out: Path, png_out: Path,
                 training_png_out: Path) -> None:
    plot(results, png_out)
    plot_training(training.get("validation", []), training_png_out)
    write_text(md_out, markdown(results, generation_stats, training, png_out.name, training_png_out.name))
