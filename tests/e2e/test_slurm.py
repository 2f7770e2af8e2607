"""The workflow through a real SLURM (tests/slurm/setup.sh makes a local one-node cluster).

A run of the e2e config through the slurm profile, with the faults of a cluster on the way:
the first generate job of `everyday` is scancel'ed once it has journaled answers (SIGTERM, then
SIGKILL: what a runtime limit sends), the train job after a few optimizer steps; the reruns resume
both. The faults come at points of the work, not at wall-clock times, so they land on every CPU.
Skipped, with the reason, where no SLURM answers.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from draftsmith.ops.status import logged_steps
from tests.conftest import REPO
from tests.e2e.conftest import CONFIG

pytestmark = pytest.mark.e2e


def slurm_answers() -> str | None:
    if not shutil.which("sinfo"):
        return "no sinfo on this machine (run tests/slurm/setup.sh as root to make a local cluster)"
    proc = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True)
    if proc.returncode != 0 or not re.search(r"idle|mix|alloc", proc.stdout):
        return f"sinfo does not show a usable node: {proc.stdout.strip() or proc.stderr.strip()}"
    return None


REASON = slurm_answers()
if REASON:
    print(f"\nSLURM tests skipped: {REASON}", file=sys.stderr)
skip = pytest.mark.skipif(REASON is not None, reason=REASON or "")


def snakemake_slurm(work: Path, config: Path, *args: str) -> subprocess.CompletedProcess:
    # The local cluster answers squeue at once: the first status check comes after 1 s, not the
    # profile's 5 (the plugin adds 10 s to each later interval while no job has finished).
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(work), "--configfile",
           str(config), "--profile", str(REPO / "profiles" / "slurm"), "--slurm-init-seconds-before-status-checks",
           "1", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=2400)


def slurm_jobs_named(rule: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i %k"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if f"rule_{rule}" in line]


class CancelJobWhen(threading.Thread):
    """scancel a rule's SLURM job once `progress` (read from its files) reaches `at` — the fault
    comes at a point of the work, never after a wall-clock time, so it lands on every CPU.
    scancel sends what a runtime limit sends: SIGTERM, then SIGKILL after KillWait."""

    def __init__(self, rule: str, progress: Callable[[], int], at: int):
        super().__init__(daemon=True)
        self.rule, self.progress, self.at, self.cancelled_at = rule, progress, at, None

    def run(self) -> None:
        deadline = time.monotonic() + 1800
        while time.monotonic() < deadline and self.cancelled_at is None:
            done = self.progress()
            jobs = slurm_jobs_named(self.rule)
            if jobs and done >= self.at:
                subprocess.run(["scancel", *jobs], check=False)
                self.cancelled_at = done
            time.sleep(0.5)


def journaled_ids(work: Path, dataset: str) -> set[str]:
    journals = (work / "results" / "responses" / ".journal").glob(f"{dataset}-*.jsonl")
    return {json.loads(line)["id"] for journal in journals for line in journal.read_text().splitlines()
            if line.endswith("}")}


def train_steps(work: Path) -> int:
    log = work / "logs" / "train" / "eagle3.log"
    steps = logged_steps(log.read_text()) if log.exists() else []
    return int(steps[-1]) if steps else 0


@skip
def test_the_workflow_runs_through_slurm_and_resumes_after_cluster_faults(workdir, tmp_path):
    """Starts from the main e2e run with longer `everyday` answers: that dataset's stages, the merge
    and training run as SLURM jobs; `humaneval`'s answers and the target are reused (only a generation
    setting changes: a changed prompt selection would rerun `humaneval`'s cross-dataset dedupe). The
    hidden states come from the transformers backend (both datasets extracted again, as SLURM jobs)."""
    cfg = yaml.safe_load(CONFIG.read_text())
    cfg["datasets"]["everyday"]["generation"].update(max_tokens=96, concurrency=4)  # four waves of answers
    cfg["hidden_states"]["backend"] = "transformers"  # a vLLM job under SLURM is generate's; this spares a start
    cfg["train"]["epochs"] = 2
    samples = cfg["datasets"]["everyday"]["max_samples"]
    config = tmp_path / "slurm.yaml"
    config.write_text(yaml.safe_dump(cfg))
    work = tmp_path / "work"
    shutil.copytree(workdir, work, symlinks=True)
    shutil.rmtree(work / "results" / "train_runs")  # only this run's checkpoints count below
    (work / "logs" / "train" / "eagle3.log").unlink()  # only this run's steps count for the scancel
    for old in (work / "results" / "responses" / ".journal").glob("everyday-*.jsonl"):
        old.unlink()  # the main run's answers (other settings): only this run's journal is read below
    generate_cut = CancelJobWhen("generate", lambda: len(journaled_ids(work, "everyday")), at=1)
    generate_cut.start()
    started = time.monotonic()
    first = snakemake_slurm(work, config, "--keep-going")
    assert first.returncode != 0 and generate_cut.cancelled_at is not None, first.stderr[-3000:]
    journaled = journaled_ids(work, "everyday")
    assert 0 < len(journaled) < samples, len(journaled)
    canceller = CancelJobWhen("train", lambda: train_steps(work), at=4)
    canceller.start()
    second = snakemake_slurm(work, config)  # generation finishes; training is scancel'ed
    assert second.returncode != 0 and canceller.cancelled_at is not None, second.stderr[-3000:]
    # The scancel'ed trainer saved a checkpoint on its way out: no earlier than the step the log showed
    # when scancel was sent (SLURM delivers SIGTERM a few steps later on a busy node), mid-epoch (below).
    (state,) = (work / "results" / "train_runs" / "eagle3").glob("*/checkpoints/*/training_state.json")
    saved_step = json.loads(state.read_text())["global_step"]
    assert saved_step >= canceller.cancelled_at
    # Export, evaluation and the report run locally in the main e2e run; here training is the target.
    third = snakemake_slurm(work, config, "results/train/eagle3/training.json")
    wall = time.monotonic() - started
    assert third.returncode == 0, third.stdout[-4000:] + third.stderr[-4000:]
    # Generation resumed from its journal: nothing journaled was sent again.
    stats = json.loads((work / "results" / "responses" / "everyday.stats.json").read_text())
    assert stats["records"] == samples and stats["prompts_sent_this_run"] == samples - len(journaled)
    # Training was scancel'ed mid-epoch and resumed from the checkpoint that stop left.
    train_log = (work / "logs" / "train" / "eagle3.log").read_text()
    assert f"Resuming mid-epoch from epoch=0 local_step={saved_step}" in train_log
    # Every job ran as a SLURM job: its log is under logs/slurm, and the controller saw it.
    rules = {p.name.removeprefix("rule_") for p in (work / "logs" / "slurm").iterdir()}
    assert {"generate", "tokenize", "hidden_states", "merge", "vocab", "train"} <= rules
    assert not (work / "logs" / "slurm" / "rule_generate" / "humaneval").exists()
    training = json.loads((work / "results" / "train" / "eagle3" / "training.json").read_text())
    assert len(training["validation"]) == cfg["train"]["epochs"]
    print(f"\nSLURM run: {wall:.0f} s wall (three attempts); generate resent {stats['prompts_sent_this_run']} of "
          f"{samples} after the scancel ({len(journaled)} journaled); train cancelled at step "
          f"{canceller.cancelled_at}, resumed from step {saved_step}", file=sys.stderr)
