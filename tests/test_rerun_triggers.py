"""A finished project is not run again because the workflow's code was updated: the profiles leave out
Snakemake's "code" trigger, which reran a job whose script is newer than its outputs and, through its outputs'
new times, every job after it (a `git pull` touching scripts/generate.py re-extracted the hidden states and
trained again). What changes an output is in its rule's params."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import yaml

from tests.conftest import REPO

CHAIN = """
rule all:
    input: "trained.txt"
rule generate:
    output: "answers.txt"
    params: max_tokens=config.get("max_tokens", 8)
    script: "scripts/generate.py"
rule train:
    input: "answers.txt"
    output: "trained.txt"
    shell: "cat {input} > {output}"
"""


def dry_run(project, *args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(project / "Snakefile"), "-d", str(project),
                           "--workflow-profile", str(REPO / "profiles" / "default"), "-n", *args],
                          capture_output=True, text=True, timeout=300, cwd=project)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout + proc.stderr


def test_an_updated_script_reruns_nothing_and_a_changed_param_reruns_its_job_and_what_follows(tmp_path):
    (tmp_path / "Snakefile").write_text(CHAIN)
    (tmp_path / "scripts").mkdir()
    script = tmp_path / "scripts" / "generate.py"
    script.write_text('open(snakemake.output[0], "w").write("answers\\n")\n')
    done = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(tmp_path / "Snakefile"), "-d", str(tmp_path),
                           "--workflow-profile", str(REPO / "profiles" / "default"), "--cores", "1"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    later = time.time() + 60
    os.utime(script, (later, later))  # the script updated after the run: newer than every output
    assert "Nothing to be done" in dry_run(tmp_path)
    changed = dry_run(tmp_path, "--config", "max_tokens=16")
    assert "rule generate:" in changed and "rule train:" in changed


def test_every_profile_leaves_out_the_code_trigger():
    for profile in ("default", "slurm"):
        settings = yaml.safe_load((REPO / "profiles" / profile / "config.yaml").read_text())
        assert "code" not in settings["rerun-triggers"] and "params" in settings["rerun-triggers"], profile
