"""``./run.sh status``: how far a run is, for whoever watches it (not only who started it).

Read from what the jobs write, never from Snakemake's DAG, so it answers in about a second while
jobs run: per dataset the answers journaled against the prompts and the token budget, errors and
an ETA (the running job's own progress line); hidden-state rows stored and their bytes; the
training epoch and the best simulated τ so far; once picked, the family published and what to serve, as the
pick's records word it; the jobs running now (local, or SLURM through
``squeue``); and the final outputs still missing.

Journals grow to GBs (100,000 answers with reasoning per dataset), so they are read
incrementally: ``.snakemake/draftsmith-status.json`` keeps, per journal, the offset read so far
and the counts up to it, and a call reads only the records appended since the last one.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

from draftsmith.config.load import WORKFLOW_DIR, from_snakemake_args, result_view
from draftsmith.config.snakemake_args import parse as parse_snakemake_args
from draftsmith.core import jsonl
from draftsmith.core.units import human_bytes
from draftsmith.generation.generate import JOURNAL_DIR, journals_of
from draftsmith.training import families

CACHE = Path(".snakemake/draftsmith-status.json")
FINAL = ("results/drafter/final.safetensors", "results/drafter/README.md", "results/report/report.md")


@dataclass
class JournalCount:
    """One journal read up to ``offset`` (a line cut by a kill is left for the next call): per record id
    its latest outcome, as generation's resume reads it. A prompt retried after a failure, or answered
    again after an edit, has several lines and counts once. A trajectory's turns (records ``{id}#{k}``) count
    as one answer, as ``max_samples`` counts them, and every turn's tokens, as the budget counts them."""

    offset: int = 0
    outcomes: dict[str, list] = field(default_factory=dict)  # record id -> [answered, completion tokens, prompt id]

    def _answered_prompts(self) -> dict[str, bool]:
        """Per prompt (a trajectory's turns under its id): whether any of its records is an answer."""
        prompts: dict[str, bool] = {}
        for ok, _, prompt_id in self.outcomes.values():
            prompts[prompt_id] = prompts.get(prompt_id, False) or ok
        return prompts

    @property
    def answered(self) -> int:
        return sum(self._answered_prompts().values())

    @property
    def dropped(self) -> int:
        prompts = self._answered_prompts()
        return len(prompts) - sum(prompts.values())

    @property
    def completion_tokens(self) -> int:
        return sum(tokens for ok, tokens, _ in self.outcomes.values() if ok)


def count_journal(path: Path, cached: JournalCount | None) -> JournalCount:
    count = cached if cached and cached.offset <= path.stat().st_size else JournalCount()
    with path.open("rb") as fh:
        fh.seek(count.offset)
        chunk = fh.read()
    complete = chunk[: chunk.rfind(b"\n") + 1]
    for record in jsonl.parse_appended(complete, path, count.offset):
        count.outcomes[record["id"]] = [record.get("status") == "ok",
                                        (record.get("usage") or {}).get("completion_tokens", 0),
                                        record.get("trajectory", record["id"])]
    count.offset += len(complete)
    return count


def count_lines(path: Path, cache: dict) -> int:
    """Lines of a file that is written once (prompts), cached by size and mtime."""
    stat = path.stat()
    key = f"{path}:{stat.st_size}:{stat.st_mtime_ns}"
    if key not in cache:
        with path.open("rb") as fh:
            cache[key] = sum(block.count(b"\n") for block in iter(lambda: fh.read(1 << 24), b""))
    return cache[key]


def log_tail(log: Path, size: int = 4096) -> str:
    if not log.exists():
        return ""
    with log.open("rb") as fh:
        fh.seek(max(0, log.stat().st_size - size))
        return fh.read().decode(errors="replace")


def logged_steps(log_text: str) -> list[int]:
    """Optimizer steps speculators logged: a dict in one process, key=value lines under torchrun."""
    return [int(s) for s in re.findall(r"global_step(?:': |=)(\d+)", log_text)]


def last_progress(log: Path) -> str | None:
    """The running job's last progress bar (done/total, rate, ETA), from the end of its log."""
    tail = log_tail(log)
    bars = [b.strip() for b in re.split(r"[\r\n]", tail) if "%|" in b]
    return bars[-1] if bars else None


@dataclass
class DatasetStatus:
    name: str
    prompts: int | None = None
    answered: int = 0
    dropped: int = 0
    completion_tokens: int = 0
    token_budget: int | None = None
    errors: int | None = None
    generation_done: bool = False
    progress: str | None = None
    hidden_state_rows: int | None = None
    hidden_state_total: int | None = None
    hidden_state_bytes: int = 0
    hidden_states_done: bool = False
    hidden_states_progress: str | None = None


def dataset_status(name: str, entry: dict, cache: dict) -> DatasetStatus:
    st = DatasetStatus(name, token_budget=entry.get("token_budget"))
    prompts = Path(f"results/prompts/{name}.jsonl")
    if prompts.exists():
        st.prompts = count_lines(prompts, cache.setdefault("lines", {}))
    journals = sorted(journals_of(JOURNAL_DIR, name), key=lambda p: p.stat().st_mtime)
    if journals:  # the newest settings; older journals belong to earlier settings
        cached = cache.get("journals", {}).get(str(journals[-1]))
        # a cache written before trajectories were counted (its "latest") is read again from the start, once
        counted = count_journal(journals[-1], JournalCount(**cached) if cached and "outcomes" in cached else None)
        cache.setdefault("journals", {})[str(journals[-1])] = asdict(counted)
        st.answered, st.dropped, st.completion_tokens = counted.answered, counted.dropped, counted.completion_tokens
    stats = Path(f"results/responses/{name}.stats.json")
    st.generation_done = stats.exists() and Path(f"results/responses/{name}.jsonl").exists()
    if st.generation_done:
        st.errors = json.loads(stats.read_text()).get("errors")
    else:
        st.progress = last_progress(Path(f"logs/generate/{name}.log"))
    folder = Path(f"results/hidden_states/{name}")
    table = Path(f"results/tokenized/{name}.parquet")
    if table.exists():
        st.hidden_state_total = pq.read_metadata(table).num_rows
    if (folder / "manifest.json").exists():
        manifest = json.loads((folder / "manifest.json").read_text())
        st.hidden_states_done = True
        st.hidden_state_rows = manifest["rows"] - len(manifest.get("failed_rows", []))
        st.hidden_state_bytes = manifest.get("bytes", 0)
    elif (folder / "index.jsonl").exists():
        lines = list(jsonl.read_appended(folder / "index.jsonl"))
        st.hidden_state_rows = len({row for e in lines for row in e["rows"]})
        st.hidden_state_bytes = sum(e["bytes"] for e in lines)
    if not st.hidden_states_done:
        st.hidden_states_progress = last_progress(Path(f"logs/hidden_states/{name}.log"))
    return st


@dataclass
class TrainingStatus:
    family: str
    run: str | None = None
    epochs_validated: int = 0
    epochs: int | None = None
    best_simulated_tau: float | None = None
    global_step: int | None = None
    done: bool = False
    chosen: str | None = None  # a finished training's: the epoch exported, what chose it and its figure


def training_status(family: str, epochs: int) -> TrainingStatus:
    """One family's training: its latest run's validated epochs and best simulated τ, its last step."""
    from draftsmith.training.train import read_validation, simulated_tau

    summary = Path(f"results/train/{family}/training.json")
    st = TrainingStatus(family, epochs=epochs, done=summary.exists())
    if st.done:
        st.chosen = chosen_by(json.loads(summary.read_text()).get("chosen") or {})
    runs = sorted(Path(f"results/train_runs/{family}").glob("*/validation.jsonl"), key=lambda p: p.stat().st_mtime)
    if runs:
        validation = read_validation(runs[-1])
        st.run = runs[-1].parent.name
        st.epochs_validated = len(validation)
        st.best_simulated_tau = max((simulated_tau(v) for v in validation), default=None)
    if not st.done:
        steps = logged_steps(log_tail(Path(f"logs/train/{family}.log"), 65536))
        st.global_step = steps[-1] if steps else None
    return st


def chosen_by(chosen: dict) -> str:
    """The exported epoch and the figure that chose it: the predicted served τ (exact or an estimate), else the
    simulated τ and why no prediction chose (training.json's ``chosen``)."""
    from draftsmith.training.export import basis_text, epoch_text

    head = f"exported {epoch_text(chosen.get('epoch'))}"
    if chosen.get("predicted_served_tau") is not None:
        at = f" at k={chosen['k']}" if chosen.get("k") else ""
        return (f"{head} by predicted served τ {chosen['predicted_served_tau']:.3f}{at} "
                f"({basis_text(chosen.get('exactness'))})")
    if chosen.get("simulated_tau") is None:
        return f"{head} ({chosen.get('reason', '–')})"
    return (f"{head} by simulated τ {chosen['simulated_tau']:.3f}"
            + (f" (no predicted served τ: {chosen['predicted_missing']})" if chosen.get("predicted_missing") else ""))


def running_jobs() -> list[str]:
    """Outputs of the jobs running now (local: Snakemake's incomplete markers while it holds its lock),
    and the user's SLURM jobs."""
    jobs = []
    if any(Path(".snakemake/locks").glob("*")):
        for marker in Path(".snakemake/incomplete").glob("*"):
            try:
                jobs.append(base64.urlsafe_b64decode(marker.name).decode())
            except ValueError:
                continue
    if shutil.which("squeue"):
        proc = subprocess.run(["squeue", "--me", "-h", "-o", "%i %j %T %M"], capture_output=True, text=True,
                              timeout=10)
        jobs += [f"slurm {line}" for line in proc.stdout.splitlines() if line.strip()]
    return sorted(jobs)


def published() -> str | None:
    """What the pick published and what to serve, as its records say (``results.json``, ``serving.json``,
    the published gate), in the words the card uses; None before the pick ran."""
    from draftsmith.evaluation.decide.schedule import one_config_text
    from draftsmith.evaluation.measure.methods import DISPLAY_NAME

    results_json, serving_json = Path("results/evaluation/results.json"), Path("results/drafter/serving.json")
    if not results_json.exists():
        return None
    results = json.loads(results_json.read_text())
    gate_json = Path("results/drafter/gate.json")
    gate = json.loads(gate_json.read_text()) if gate_json.exists() else {}
    plan = json.loads(serving_json.read_text())["schedule"] if serving_json.exists() else results.get("schedule")
    family = results["pick"]["family"]
    gate_said = f"; export gate {'passed' if gate.get('passed') else 'FAILED'}: {gate['verdict']}" \
        if gate.get("verdict") else ""
    serve = f" {one_config_text(plan, results.get('serving', []))}" if plan else ""
    return f"published {DISPLAY_NAME.get(family, family)} ({results['pick']['why']}){gate_said}.{serve}"


@dataclass
class Status:
    datasets: list[DatasetStatus]
    training: list[TrainingStatus]
    running: list[str]
    missing: list[str] = field(default_factory=list)
    seconds: float = 0.0
    published: str | None = None


def collect(config: dict) -> Status:
    started = time.monotonic()
    cache = json.loads(CACHE.read_text()) if CACHE.exists() else {}
    datasets = [dataset_status(n, e, cache) for n, e in sorted(config["datasets"].items())]
    if CACHE.parent.exists():
        tmp = CACHE.with_suffix(".partial")
        tmp.write_text(json.dumps(cache))
        tmp.replace(CACHE)
    train = result_view(config)["train"]
    training = [training_status(f, families.settings(train, f)["epochs"]) for f in train["families"]]
    status = Status(datasets, training, running_jobs(),
                    [p for p in FINAL if not Path(p).exists()], published=published())
    status.seconds = time.monotonic() - started
    return status


def _n(value) -> str:
    return "–" if value is None else f"{value:,}"


def render(status: Status) -> str:
    lines = ["answers                      prompts   answered  dropped  errors  tokens / budget"]
    for d in status.datasets:
        budget = f"{_n(d.completion_tokens)} / {_n(d.token_budget)}" if d.token_budget else _n(d.completion_tokens)
        state = "done" if d.generation_done else d.progress or ("not started" if not d.answered else "stopped")
        lines.append(f"  {d.name:<26} {_n(d.prompts):>8} {d.answered:>10,} {d.dropped:>8,} {_n(d.errors):>7}  "
                     f"{budget}  {state}")
    lines.append("hidden states                rows / total        bytes")
    for d in status.datasets:
        state = "done" if d.hidden_states_done else (d.hidden_states_progress or "")
        lines.append(f"  {d.name:<26} {_n(d.hidden_state_rows):>6} / {_n(d.hidden_state_total):<8} "
                     f"{human_bytes(d.hidden_state_bytes):>11}  {state}")
    for t in status.training:
        tau = f"{t.best_simulated_tau:.3f}" if t.best_simulated_tau is not None else "–"
        lines.append(f"training {t.family}: {'done' if t.done else 'run ' + (t.run or '–')}, {t.epochs_validated} "
                     f"of {t.epochs} epochs validated, "
                     + (t.chosen or f"best simulated τ so far {tau}")
                     + (f"; optimizer step {t.global_step}" if t.global_step is not None else ""))
    if status.published:
        lines.append(status.published)
    lines.append("running now: " + ("; ".join(status.running) if status.running else "nothing"))
    lines.append("still missing: " + (", ".join(status.missing) if status.missing else "nothing"))
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    """``python -m draftsmith.ops.status [-d WORKDIR] [--configfile FILE ...] [--json]``"""
    config = from_snakemake_args(argv, WORKFLOW_DIR)
    os.chdir(parse_snakemake_args(argv).directory or ".")
    status = collect(config)
    print(json.dumps(asdict(status), indent=1) if "--json" in argv else render(status))


if __name__ == "__main__":
    main(sys.argv[1:])
