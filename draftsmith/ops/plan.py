"""A plan before running: tokens, bytes, time and cost per dataset and stage, and whether it fits.

Cheap by design: it reads the prompt files, the target's ``config.json`` (or GGUF header) and its
tokenizer, never the weights, and starts no server. Estimates come from the config (budgets,
``max_samples``, ``max_tokens``) and, where a journal exists, from the answers measured so far;
throughputs from ``plan.throughput`` or from timings of earlier runs (``results/timings``).
When the workflow has run, the plan also shows what was measured next to what it estimated.
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
from dataclasses import dataclass
from pathlib import Path

from draftsmith.config.target import Facts
from draftsmith.core import jsonl, platform
from draftsmith.core.units import TB, human_bytes
from draftsmith.data.chat import prepare_messages
from draftsmith.data.merge import MIN_VALIDATION_PROMPTS, validation_prompts
from draftsmith.evaluation.measure import methods
from draftsmith.evaluation.measure.evaluate import requests_for
from draftsmith.generation.generate import calls_as_structure, history_messages, journals_of
from draftsmith.training import families, replay

BYTES_PER_VALUE = 2  # bf16


@dataclass
class DatasetPlan:
    name: str
    prompts: int
    samples: float
    completion_per_sample: float
    completion_source: str
    prompt_tokens_per_sample: float
    prior_completion_tokens: float = 0.0  # from the config alone, before anything was measured
    completion_tokens: float = 0.0
    sequence_tokens: float = 0.0
    rows_per_sample: float = 1.0  # a trajectory's turns: a row each, each with its own prefix

    @property
    def rows(self) -> float:
        return self.samples * self.rows_per_sample


def bytes_per_token(hidden_size: int, slots: int = 4, storage: str = "bf16") -> int:
    """(3 auxiliary + 1 final) layers x hidden in ``storage`` (bf16: 2 bytes; fp8: 1, plus a float32
    scale per layer), plus the int64 token id."""
    if storage == "fp8":
        return slots * (hidden_size + 4) + 8
    return slots * hidden_size * BYTES_PER_VALUE + 8


def hidden_state_bytes(tokens: float, facts: Facts, layout: str, rows: float, storage: str = "bf16") -> float:
    """Offline storage, with file overhead (a safetensors header per file; shards share theirs)."""
    overhead = 4096 * rows if layout == "per_row" else 0
    return tokens * bytes_per_token(facts.hidden_size, storage=storage) + overhead


def journal_mean(journal_dir: Path, dataset: str) -> tuple[float, int] | None:
    """Mean completion tokens of the answers journaled so far for a dataset (any settings)."""
    lengths = []
    for path in journals_of(journal_dir, dataset):
        lengths += [r["usage"]["completion_tokens"] for r in jsonl.read_appended(path) if r.get("status") == "ok"]
    return (statistics.fmean(lengths), len(lengths)) if lengths else None


def row_prompts(renderer, prompts: list, sample: int, tool_rendering: str = "template",
                max_length: int | None = None) -> tuple[float, float]:
    """Mean tokens of a row's prompt as the server renders it, and rows per sample, over the first ``sample``
    prompts. A chat prompt: its first turn, one row. A trajectory: every turn's prefix (the dataset's
    conversation up to it, an OpenHands one's calls as generation sends them: ``tool_rendering``), a row each,
    so its prompt tokens are paid once per turn, up to the first turn whose prefix leaves no answer token within
    ``max_length``: generation ends the trajectory there (its later turns are longer still)."""
    lengths, rows = [], []
    for prompt in prompts[:sample]:
        contexts = ([history_messages(prompt, k, tool_rendering) for k in range(len(prompt.turns))]
                    if prompt.history is not None else [[{"role": "user", "content": prompt.turns[0]}]])
        rendering = renderer.with_tools(prompt.tools) if calls_as_structure(prompt, tool_rendering) else renderer
        sent = []
        for messages in contexts:
            sent.append(len(rendering.ids(rendering.text(prepare_messages(messages, "template"), True))))
            if prompt.history is not None and max_length and sent[-1] >= max_length:
                sent.pop()
                break
        lengths += sent
        rows.append(len(sent))
    return (statistics.fmean(lengths), statistics.fmean(rows)) if lengths else (0.0, 1.0)


def plan_dataset(name: str, entry: dict, prompts: list, prompt_tokens: float, fraction: float, journal_dir: Path,
                 max_length: int, rows_per_sample: float = 1.0) -> DatasetPlan:
    """``prompt_tokens``: a row's mean prompt; ``rows_per_sample``: answers (and rows) per sample, a trajectory's
    turns, which ``max_samples`` and the budget count as one sample (:func:`row_prompts` gives both)."""
    max_tokens = entry["generation"]["max_tokens"]
    prior = fraction * max_tokens
    measured = journal_mean(journal_dir, name)
    per_answer, source = (measured[0], f"measured over {measured[1]} answers") if measured else \
        (prior, f"{fraction:g} x max_tokens {max_tokens}")
    if rows_per_sample != 1:
        source += f", x {rows_per_sample:.1f} turns"

    def samples_for(per: float) -> float:
        n = float(len(prompts) if entry["max_samples"] is None else min(len(prompts), entry["max_samples"]))
        return min(n, entry["token_budget"] / per) if entry["token_budget"] is not None and per else n

    samples = samples_for(per_answer * rows_per_sample)
    plan = DatasetPlan(name, len(prompts), samples, per_answer * rows_per_sample, source, prompt_tokens,
                       rows_per_sample=rows_per_sample)
    plan.prior_completion_tokens = samples_for(prior * rows_per_sample) * prior * rows_per_sample
    plan.completion_tokens = samples * per_answer * rows_per_sample
    plan.sequence_tokens = plan.rows * min(prompt_tokens + per_answer, max_length)
    return plan


@dataclass
class Throughput:
    generation_tok_s: float | None
    extraction_tok_s: float | None
    training_tok_s: dict[str, float]  # per drafter family: a DFlash of 5 layers trains slower than EAGLE-3's 1
    sources: dict


def measured_throughput(results: Path, configured: dict, trained: list[str] = (families.DEFAULT_FAMILY,)) \
        -> Throughput:
    """Configured figures win; else tokens per second of earlier runs' jobs (results/timings), training
    per family of ``trained``."""
    def timing(path: Path) -> float | None:
        if not path.exists():
            return None
        lines = path.read_text().splitlines()
        return float(lines[1].split("\t")[0]) if len(lines) > 1 else None

    found, sources = {}, {}
    gen = [(json.loads(p.read_text())["completion_tokens"],
            timing(results / "timings" / "generate" / f"{p.name.removesuffix('.stats.json')}.tsv"))
           for p in (results / "responses").glob("*.stats.json")]
    hs = [(json.loads(p.read_text())["tokens"], timing(results / "timings" / "hidden_states" / f"{p.parent.name}.tsv"))
          for p in (results / "hidden_states").glob("*/manifest.json")]
    for key, pairs in (("generation_tok_s", gen), ("extraction_tok_s", hs)):
        pairs = [(t, s) for t, s in pairs if s]
        if pairs:
            found[key], sources[key] = sum(t for t, _ in pairs) / sum(s for _, s in pairs), "measured (earlier run)"
    training = {}
    for family in trained:
        summary, seconds = results / "train" / family / "training.json", timing(results / "timings" /
                                                                               f"train_{family}.tsv")
        tokens = json.loads(summary.read_text()).get("trained_tokens") if summary.exists() and seconds else None
        if tokens:
            training[family], sources[f"training_tok_s.{family}"] = tokens / seconds, "measured (earlier run)"
    for key, value in configured.items():
        if value is None:
            continue
        if key == "training_tok_s":
            training.update(dict.fromkeys(trained, value))
            sources.update(dict.fromkeys((f"training_tok_s.{f}" for f in trained), "configured"))
        else:
            found[key], sources[key] = value, "configured"
    return Throughput(found.get("generation_tok_s"), found.get("extraction_tok_s"), training, sources)


@dataclass
class GridPlan:
    """The evaluation grid before work: every method's job measures the target alone and each of its cells
    (draft length x drafter) on a server of its own, at every concurrency, prompt set and temperature."""

    cells: int  # (method, draft length, concurrency) triples measured
    servers: int  # server starts, the targets-alone included (once for the grid on GPUs, per method on a CPU)
    per_length: int  # server starts each draft length of evaluation.num_speculative_tokens costs
    tokens: dict[int, float]  # output tokens expected at each concurrency (warm-ups at 1)
    rates: dict[int, float | None]  # output tok/s at each concurrency
    rate_source: str
    start_s: float | None  # seconds a server takes to start
    start_source: str

    @property
    def seconds(self) -> float | None:
        if self.start_s is None or any(not self.rates.get(c) for c in self.tokens):
            return None
        return self.servers * self.start_s + sum(t / self.rates[c] for c, t in self.tokens.items())


def grid_plan(config: dict, sets: dict[str, tuple[int, int]], results: Path, throughput: Throughput) -> GridPlan:
    """``sets``: each evaluation set's (prompts, turns). A block family drafts one length (its block);
    EAGLE-3 and the training-free methods each of ``evaluation.num_speculative_tokens``; a warm start's
    pretrained drafter is measured beside EAGLE-3's (:func:`draftsmith.evaluation.measure.methods.servers`).
    Rates per concurrency and start-up times come from an earlier run's evaluations where there are any
    (output tokens over wall time, the servers' own start-up); else generation's throughput, scaled down
    below generation's concurrency (fewer requests in flight decode fewer tokens per step), and
    ``plan.server_start_s``."""
    ev = config["evaluation"]
    warm = bool(config["train"]["from_pretrained"])
    per_method = {m: methods.servers(m, ev, warm)
                  for m in [*config["train"]["families"], *methods.measured_training_free(ev)]}
    shared = platform.baseline_once_per_grid("cuda" if config["server"]["gpus"] else "cpu")
    servers = sum(per_method.values()) - (len(per_method) - 1 if shared else 0)
    per_length = sum(methods.servers(m, {**ev, "num_speculative_tokens": [0, 0]}, warm)
                     - methods.servers(m, {**ev, "num_speculative_tokens": [0]}, warm) for m in per_method)
    per_answer = ev["max_tokens"] * config["plan"]["completion_fraction"]
    # each set is sent as at least two rounds of the concurrency (evaluate.requests_for), turns per prompt kept
    tokens = {c: servers * len(ev["temperatures"]) * per_answer * sum(
        requests_for(prompts, c) * turns / max(prompts, 1) for prompts, turns in sets.values())
              for c in ev["concurrency"]}
    tokens[1] = tokens.get(1, 0.0) + servers * per_answer  # one warm-up request per server
    measured = [json.loads(p.read_text()) for p in sorted((results / "evaluation").glob("*.json"))
                if p.stem in per_method]
    runs: dict[int, list[dict]] = {}
    for evaluation in measured:
        for part in (*evaluation.get("baseline", []), *evaluation.get("cells", [])):
            runs.setdefault(part["concurrency"], []).extend(part["runs"])
    generation = max((d["generation"]["concurrency"] for d in config["datasets"].values()
                      if d.get("kind", "prompts") == "prompts"), default=None)
    rates: dict[int, float | None] = {}
    for c in tokens:
        done = [r for r in runs.get(c, []) if r.get("window_s") or r.get("wall_s")]  # wall_s: runs from before
        if done:
            rates[c] = sum(r["output_tokens"] for r in done) / sum(r.get("window_s") or r["wall_s"] for r in done)
        elif throughput.generation_tok_s and generation:
            rates[c] = throughput.generation_tok_s * min(1.0, c / generation)
        else:
            rates[c] = None
    scaled = f"generation's throughput ({throughput.sources.get('generation_tok_s', 'unknown')}) scaled by concurrency"
    source = f"measured by earlier evaluations where they ran, else {scaled}" if runs else scaled
    starts = [s for evaluation in measured for s in evaluation.get("server_start_s", [])]
    start_s, start_source = config["plan"]["server_start_s"], "plan.server_start_s"
    if starts:
        start_s, start_source = statistics.fmean(starts), "measured (earlier evaluations)"
    return GridPlan(sum(n - 1 for n in per_method.values()) * len(ev["concurrency"]), servers, per_length, tokens,
                    rates, source, start_s, start_source)


def grid_section(grid: GridPlan, training_s: float | None) -> list[str]:
    """The grid's size and time, named when it would take longer than the training."""
    start = f"{grid.start_s:.0f} s each ({grid.start_source})" if grid.start_s is not None else \
        "start-up unknown: set plan.server_start_s"
    rates = ", ".join(f"{rate:,.0f} tok/s at {c}" if rate else f"unknown at {c}" for c, rate in sorted(
        grid.rates.items()))
    lines = ["", "## Evaluation grid", "",
             f"{grid.cells} cells (method x draft tokens x concurrency), {grid.servers} server starts ({start}), "
             f"~{sum(grid.tokens.values()):,.0f} output tokens ({rates}; {grid.rate_source}): "
             + ("time unknown." if grid.seconds is None else f"**{grid.seconds / 3600:.1f} h**."),
             "- A schedule whose draft length changes with the batch is served once more after the pick (one start, "
             "and the target alone again on a CPU)."]
    if grid.start_s is not None:
        hours = grid.per_length * grid.start_s / 3600
        lines.append(f"- Each draft length of evaluation.num_speculative_tokens costs {grid.per_length} server starts "
                     f"(~{hours:.1f} h of start-up alone): a shorter grid measures fewer of them. Tokens per step "
                     "rise with the draft length, so a grid ranked by them (pick_by: tau, and every CPU's) "
                     "picks the largest but for the runs' noise: the length that serves best on a GPU is found "
                     "only by its speed-ups, each length served.")
    if grid.seconds is not None and training_s and grid.seconds > training_s:
        lines.append(f"- **The evaluation grid would take longer than the training ({training_s / 3600:.1f} h)**: "
                     "fewer concurrencies or draft lengths (evaluation.concurrency, num_speculative_tokens), fewer "
                     "evaluation prompts or temperatures, or a smaller max_tokens.")
    return lines


def engine_check_section(config: dict, results: Path) -> list[str]:
    """What the engine check asks before any work, and what it found where it has run."""
    families_ = config["train"]["families"]
    if not config["server"]["engine_check"]:
        return ["", "## Engine check", "", "Off (`server.engine_check: false`): a target + drafter pair the engine "
                "cannot serve is found at the export gate, after training."]
    lines = ["", "## Engine check", "",
             f"Before any work, vLLM starts on a weightless twin of the target (the same attention, cache and rope "
             f"shapes, four layers, a few small experts) with a random drafter of each family ({', '.join(families_)}) "
             "and drafts once: a pair it cannot serve fails there, naming the error "
             "(`results/checks/engine.{cpu,gpu}.json`)."]
    found = results / "checks" / f"engine.{'gpu' if config['server']['gpus'] else 'cpu'}.json"
    if found.exists():
        checked = json.loads(found.read_text())
        lines += ["", "| family | served | seconds | note |", "|---|---|---:|---|"]
        lines += [f"| {family} | {'yes' if r.get('served') else 'not started' if r.get('served') is None else 'NO'} | "
                  f"{r.get('seconds', 0):.0f} | {r.get('skipped') or r.get('error') or ''} |"
                  for family, r in checked.items() if isinstance(r, dict)]
    return lines


def drafter_parameters(family: str, facts: Facts, layers: int, draft_vocab: int) -> int:
    """About how many parameters the drafter holds on the serving GPU beside the target (the target's
    embedding is shared): its decoder layers at the target's width (an EAGLE-3 layer's q, k and v read
    the embedding and the hidden state, twice the width), the fc over the three target layers, and the
    draft LM head. An upper bound: grouped-query attention makes k and v narrower."""
    h = facts.hidden_size
    attention = (7 if family == families.DEFAULT_FAMILY else 4) * h * h
    return layers * (attention + 3 * h * facts.intermediate_size) + 3 * h * h + draft_vocab * h


def _hours(tokens: float, rate: float | None) -> str:
    return "–" if not rate else f"{tokens / rate / 3600:.1f} h"


def render(plans: list[DatasetPlan], facts: Facts, config: dict, throughput: Throughput, free_bytes: float,
           free_source: str) -> tuple[str, dict]:
    hs_cfg, train = config["hidden_states"], config["train"]
    completion = sum(p.completion_tokens for p in plans)
    sequence = sum(p.sequence_tokens for p in plans)
    rows = sum(p.rows for p in plans)
    storage = hs_cfg["storage"]
    layouts = {layout: hidden_state_bytes(sequence, facts, layout, rows, storage) for layout in ("shards", "per_row")}
    need = 0.0 if hs_cfg["mode"] == "online" else layouts[hs_cfg["layout"]]
    fits = need <= 0.95 * free_bytes
    in_fp8 = hidden_state_bytes(sequence, facts, hs_cfg["layout"], rows, "fp8")
    cost = config["plan"]["gpu_hour_cost"]
    lines = ["# draftsmith plan", "",
             f"Target: {facts.num_layers} layers, hidden size {facts.hidden_size}, vocabulary {facts.vocab_size}. "
             f"Hidden states **{hs_cfg['mode']}**"
             + ("" if hs_cfg["mode"] == "online" else f" ({hs_cfg['layout']}, {storage})")
             + f"; drafter families {', '.join(train['families'])}.", "",
             "| dataset | prompts | samples | completion tokens / sample | completion tokens | sequence tokens | "
             f"hidden states (shards, {storage}) |", "|---|---:|---:|---|---:|---:|---:|"]
    for p in plans:
        lines.append(f"| {p.name} | {p.prompts:,} | {p.samples:,.0f} | {p.completion_per_sample:,.0f} "
                     f"({p.completion_source}) | {p.completion_tokens:,.0f} | {p.sequence_tokens:,.0f} | "
                     f"{human_bytes(hidden_state_bytes(p.sequence_tokens, facts, 'shards', p.rows, storage))} |")
    for p in plans:
        if p.rows_per_sample != 1 and p.completion_per_sample:
            per_answer = p.completion_per_sample / p.rows_per_sample
            lines.append(f"\n{p.name}: trajectories of {p.rows_per_sample:.1f} turns, each turn a row holding its own "
                         f"prefix of ~{p.prompt_tokens_per_sample:,.0f} prompt tokens: "
                         f"{p.prompt_tokens_per_sample / per_answer:.1f} prompt tokens per supervised token.")
    lines += ["", "| stage | work | throughput | time | GPU-hours cost |", "|---|---|---|---:|---:|"]
    stages = [("generate", completion, "completion tokens", throughput.generation_tok_s, "generation_tok_s",
               config["server"]["gpus"]),
              ("hidden_states", 0 if hs_cfg["mode"] == "online" else sequence, "sequence tokens",
               throughput.extraction_tok_s, "extraction_tok_s", config["server"]["gpus"]),
              *((f"train {family}", sequence * families.settings(train, family)["epochs"],
                 "sequence tokens x epochs", throughput.training_tok_s.get(family), f"training_tok_s.{family}",
                 train["gpus"] + (config["server"]["gpus"] if hs_cfg["mode"] == "online" else 0))
                for family in train["families"])]
    training_s = 0.0
    for name, work, unit, rate, key, gpus in stages:
        hours = work / rate / 3600 if rate else None
        if name.startswith("train "):
            training_s = training_s + hours * 3600 if hours is not None and training_s is not None else None
        money = f"{hours * gpus * cost:,.0f}" if hours is not None and cost and gpus else "–"
        source = throughput.sources.get(key, "set plan.throughput." + key.split(".")[0])
        lines.append(f"| {name} | {work:,.0f} {unit} | {f'{rate:,.0f} tok/s' if rate else 'unknown'} ({source}) | "
                     f"{_hours(work, rate)} | {money} |")
    prompts = sum(p.samples for p in plans)
    held_out = validation_prompts(round(prompts), config["merge"]["validation_fraction"])
    lines += ["", f"Validation holds out {held_out:,} of the ~{prompts:,.0f} answers' prompts "
              f"(merge.validation_fraction {config['merge']['validation_fraction']:g}, at least the smaller of "
              f"{MIN_VALIDATION_PROMPTS} and a quarter of them): the predicted served τ that chooses the checkpoint "
              f"replays the drafter on {replayed_rows(held_out, sequence / rows if rows else 0)}.", "", "## Disk", "",
              f"- Hidden states, offline in {storage}: **{human_bytes(layouts['shards'])}** in shards, "
              f"{human_bytes(layouts['per_row'])} one file per row ({rows:,.0f} files)"
              + ("" if storage == "fp8" else f"; in fp8: {human_bytes(in_fp8)} ({hs_cfg['layout']})")
              + "; online: nothing stored.",
              f"- Free where the results go: {human_bytes(free_bytes)} ({free_source}).",
              f"- This config needs {human_bytes(need)}: " + ("it fits." if fits else "**it does not fit.**")]
    if not fits and storage == "bf16":
        fp8_rows = rows * 0.95 * free_bytes / in_fp8
        lines.append(f"- In fp8 (`hidden_states: {{storage: fp8}}`: a float32 scale per token and layer, dequantized "
                     f"when training reads it) it needs {human_bytes(in_fp8)}: "
                     + ("**it fits.**" if fp8_rows >= rows else
                        f"about {fp8_rows:,.0f} of the {rows:,.0f} rows fit, not enough for this config either."))
    if not fits:
        lines.append(f"- Use `hidden_states: {{mode: online}}` (nothing stored; the train job serves the target), or "
                     f"a volume with {human_bytes(need / 0.95)} free, or fewer samples "
                     f"(about {rows * 0.95 * free_bytes / need:,.0f} fit).")
    plan = {"completion_tokens": completion, "sequence_tokens": sequence, "rows": rows,
            "storage": storage, "hidden_state_bytes": layouts, "fp8_bytes": in_fp8, "needed_bytes": need,
            "free_bytes": free_bytes, "fits": fits, "training_s": training_s,
            "datasets": {p.name: p.__dict__ for p in plans}}
    return "\n".join(lines) + "\n", plan


def replayed_rows(held_out: int, row_tokens: float) -> str:
    """How many validation rows the replay reads, in words: up to replay.ROWS rows and replay.TOKENS positions
    (prompts included), but read on until replay.MIN_ROWS of them do not loop."""
    by_positions = math.ceil(replay.TOKENS / row_tokens) if row_tokens else replay.ROWS
    rows = min(held_out, replay.ROWS, max(replay.MIN_ROWS, by_positions))
    return (f"about {rows:,} of them (at most {replay.ROWS} rows and {replay.TOKENS:,} positions, prompts included, "
            f"but no fewer than {replay.MIN_ROWS} whose answers do not loop; at ~{row_tokens:,.0f} tokens a row)")


def drafters_section(facts: Facts, config: dict, results: Path) -> list[str]:
    """Each family's drafter as the serving GPUs hold it (bf16), estimated, and measured where an earlier
    run exported one."""
    train, draft_vocab = config["train"], min(config["vocab"]["draft_vocab_size"], facts.vocab_size)
    lines = ["", "## Drafters at serving", "", "| family | draft layers | parameters (≈) | GPU memory, bf16 (≈) | "
             "exported earlier |", "|---|---:|---:|---:|---:|"]
    for family in train["families"]:
        settings = families.settings(train, family)
        layers = settings["num_layers"] or families.SPECULATORS_LAYERS
        params = drafter_parameters(family, facts, layers, draft_vocab) if facts.intermediate_size else None
        exported = results / "drafters" / family / "final.safetensors"
        estimate = f"{params / 1e6:,.0f} M | {human_bytes(2 * params)}" if params else "– | –"
        lines.append(f"| {family} | {layers} | {estimate} | "
                     f"{human_bytes(exported.stat().st_size) if exported.exists() else '–'} |")
    return lines


def free_space(results: Path, configured_tb: float | None) -> tuple[float, str]:
    if configured_tb is not None:
        return configured_tb * TB, "plan.free_tb"
    folder = results
    while not folder.exists():
        folder = folder.parent
    return float(shutil.disk_usage(folder).free), f"measured at {results}"


def measured_section(results: Path, plans: list[DatasetPlan]) -> list[str]:
    """Estimates next to what an earlier run measured, per dataset and stage."""
    lines = []
    for p in plans:
        stats = results / "responses" / f"{p.name}.stats.json"
        manifest = results / "hidden_states" / p.name / "manifest.json"
        if stats.exists() and p.prior_completion_tokens:
            done = json.loads(stats.read_text())["completion_tokens"]
            lines.append(f"| {p.name} | completion tokens (from the config alone) | {p.prior_completion_tokens:,.0f} | "
                         f"{done:,} | {done / p.prior_completion_tokens:.2f} |")
        if manifest.exists() and p.sequence_tokens:
            m = json.loads(manifest.read_text())
            lines.append(f"| {p.name} | sequence tokens | {p.sequence_tokens:,.0f} | {m['tokens']:,} | "
                         f"{m['tokens'] / p.sequence_tokens:.2f} |")
    if not lines:
        return []
    return ["", "## Estimated vs measured (an earlier run of this config)", "",
            "| dataset | quantity | estimated | measured | measured / estimated |", "|---|---|---:|---:|---:|", *lines]
