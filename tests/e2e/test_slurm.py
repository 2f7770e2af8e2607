"""The workflow through a real SLURM (tests/slurm/setup.sh makes a local one-node cluster).

A run of the e2e config through the slurm profile, with the faults of a cluster on the way:
the first generate job of `everyday` hits its runtime limit (SLURM signals it, then kills it),
the train job is scancel'ed after a few steps; the rerun resumes both. Skipped, with the reason,
where no SLURM answers.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from draftsmith.status import logged_steps
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
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(work), "--configfile",
           str(config), "--profile", str(REPO / "profiles" / "slurm"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=2400)


def slurm_jobs_named(rule: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i %k"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if f"rule_{rule}" in line]


class CancelTrainAfterSteps(threading.Thread):
    """scancel the train job once its log shows a few optimizer steps (a cluster operator's scancel)."""

    def __init__(self, work: Path, steps: int):
        super().__init__(daemon=True)
        self.work, self.steps, self.cancelled_at_step = work, steps, None

    def run(self) -> None:
        log = self.work / "logs" / "train.log"
        deadline = time.monotonic() + 1800
        while time.monotonic() < deadline and self.cancelled_at_step is None:
            steps = logged_steps(log.read_text()) if log.exists() else []
            jobs = slurm_jobs_named("train")
            if jobs and len(steps) >= self.steps:
                subprocess.run(["scancel", *jobs], check=False)
                self.cancelled_at_step = int(steps[-1])
            time.sleep(0.5)


@skip
def test_the_workflow_runs_through_slurm_and_resumes_after_cluster_faults(workdir, tmp_path):
    """Starts from the main e2e run with more and longer `everyday` answers: that dataset's stages,
    the merge, training and export run as SLURM jobs; `humaneval` and the target are reused."""
    cfg = yaml.safe_load(CONFIG.read_text())
    cfg["datasets"]["everyday"].update(max_samples=32, generation={"max_tokens": 192, "concurrency": 8})
    cfg["train"]["epochs"] = 2
    config = tmp_path / "slurm.yaml"
    config.write_text(yaml.safe_dump(cfg))
    work = tmp_path / "work"
    shutil.copytree(workdir, work, symlinks=True)
    shutil.rmtree(work / "results" / "train_runs")  # only this run's checkpoints count below
    (work / "logs" / "train.log").unlink()  # only this run's steps count for the scancel
    for old in (work / "results" / "responses" / ".journal").glob("everyday-*.jsonl"):
        old.unlink()  # the main run's answers (other settings): only this run's journal is read below
    canceller = CancelTrainAfterSteps(work, steps=4)
    canceller.start()
    started = time.monotonic()
    # A runtime limit of two minutes cuts the everyday generate job (its server alone starts in 30-80 s).
    first = snakemake_slurm(work, config, "--set-resources", "generate:runtime=2", "--keep-going")
    assert first.returncode != 0, "the runtime limit should have stopped the first run"
    journal = next((work / "results" / "responses" / ".journal").glob("everyday-*.jsonl"))
    journaled = {json.loads(line)["id"] for line in journal.read_text().splitlines() if line.endswith("}")}
    assert 0 < len(journaled) < 32, len(journaled)
    second = snakemake_slurm(work, config)  # generation finishes; training is scancel'ed
    assert second.returncode != 0 and canceller.cancelled_at_step is not None, second.stderr[-3000:]
    # The scancel'ed trainer saved a mid-epoch checkpoint on its way out.
    (state,) = (work / "results" / "train_runs").glob("*/checkpoints/*/training_state.json")
    saved_step = json.loads(state.read_text())["global_step"]
    assert 0 < saved_step <= canceller.cancelled_at_step + 1
    # Evaluation and the report run locally in the main e2e run; here the drafter is the target.
    third = snakemake_slurm(work, config, "results/drafter/final.safetensors")
    wall = time.monotonic() - started
    assert third.returncode == 0, third.stdout[-4000:] + third.stderr[-4000:]
    # Generation resumed from its journal: nothing journaled was sent again.
    stats = json.loads((work / "results" / "responses" / "everyday.stats.json").read_text())
    assert stats["records"] == 32 and stats["prompts_sent_this_run"] == 32 - len(journaled)
    # Training was scancel'ed mid-epoch and resumed from the checkpoint that stop left.
    train_log = (work / "logs" / "train.log").read_text()
    assert f"Resuming mid-epoch from epoch=0 local_step={saved_step}" in train_log
    # Every job ran as a SLURM job: its log is under logs/slurm, and the controller saw it.
    rules = {p.name.removeprefix("rule_") for p in (work / "logs" / "slurm").iterdir()}
    assert {"prompts", "generate", "tokenize", "hidden_states", "merge", "vocab", "train", "export"} <= rules
    gate = json.loads((work / "results" / "drafter" / "gate.json").read_text())
    assert gate["passed"]
    print(f"\nSLURM run: {wall:.0f} s wall (three attempts); generate resent {stats['prompts_sent_this_run']} of 32 "
          f"after the runtime limit ({len(journaled)} journaled); train cancelled at step "
          f"{canceller.cancelled_at_step}, resumed from step {saved_step}", file=sys.stderr)
