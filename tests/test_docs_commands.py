"""Every command README.md and docs/ show is run here, as a user types it, on a copy of the
workflow: workflow runs as a dry run (`-n`: their GPU jobs cannot run on this machine), the
commands beside Snakemake (config, status, redo with `-n`) whole. `my.yaml` is the embedded
default, `DATASET` one of its datasets."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# What the docs show that is not draftsmith's to run here: shell set-up, another tool, a command
# that needs a finished run (tests/e2e/test_workflow.py runs Snakemake's report on one).
NOT_OURS = ("export ", "hf ", "./run.sh --report", "./test.sh")


def shown_commands() -> list[str]:
    """Lines of the docs' code blocks and inline code that start with ./run.sh, ./test.sh or sbatch."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        blocks = re.findall(r"^```(?:bash|sh)?\n(.*?)^```", text, re.M | re.S)
        lines = [line for block in blocks for line in block.splitlines()]
        lines += re.findall(r"`(\./run\.sh[^`]*)`", text)
        for line in lines:
            command = re.sub(r"\s+#.*$", "", line).strip()
            if command.startswith(("./run.sh", "sbatch")) and not command.startswith(NOT_OURS):
                found.append(command)
    return sorted(set(found))


def as_run_here(command: str, dataset: str) -> list[str]:
    """The command with the docs' placeholders filled; a run of GPU jobs or a redo only previews."""
    command = command.replace("[--configfile F ...]", "--configfile my.yaml").replace("[-n]", "-n")
    argv = [dataset if a == "DATASET" else a for a in shlex.split(command)]
    if argv[0] == "sbatch":  # the job's own command, asked for its usage: the module and its arguments exist
        job = shlex.split(argv[argv.index("--wrap") + 1].replace("\\$", "$"))
        # a GPU node's stack (.venv-gpu) runs the same module as the stack set up here
        return [job[0].replace(".venv-gpu/", ".venv/"), *job[1:], "--help"]
    runs_here = argv[1:2] in (["config"], ["status"]) or "--unlock" in argv or "results/plan.md" in argv
    return argv if runs_here or "-n" in argv else [*argv, "-n"]


DEFAULT_DATASET = sorted(yaml.safe_load((REPO / "config" / "config.yaml").read_text())["datasets"])[0]
TO_RUN = sorted({tuple(as_run_here(c, DEFAULT_DATASET)) for c in shown_commands()})


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A checkout elsewhere, sharing this one's set-up .venv. This checkout's set-up runs first: were the
    venv out of date, the copy's run.sh would reinstall draftsmith editable from the copy, which is
    deleted after the tests (every later vLLM process then failed to import draftsmith's plugin)."""
    subprocess.run([str(REPO / "envs" / "setup.sh")], check=True, timeout=1800)
    copy = tmp_path_factory.mktemp("checkout")
    for name in ("Snakefile", "run.sh", "pyproject.toml", "rules", "scripts", "config", "report", "envs", "profiles",
                 "draftsmith"):
        (shutil.copytree if (REPO / name).is_dir() else shutil.copy)(REPO / name, copy / name)
    (copy / ".venv").symlink_to(REPO / ".venv")
    shutil.copy(REPO / "config" / "config.yaml", copy / "my.yaml")
    return copy


def test_the_docs_show_the_commands_a_user_needs():
    shown = shown_commands()
    for needed in ("./run.sh", "./run.sh status", "./run.sh --profile profiles/slurm --configfile my.yaml"):
        assert needed in shown, shown


@pytest.mark.parametrize("argv", TO_RUN, ids=" ".join)
def test_a_command_the_docs_show_runs(argv, project):
    proc = subprocess.run(argv, cwd=project, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PATH": f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}"})
    assert proc.returncode == 0, f"{argv}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def test_a_target_after_configfile_is_moved_before_it(project):
    """``./run.sh --configfile my.yaml results/plan.md`` is the order people type: Snakemake read the
    target as a second config file and failed with a traceback; run.sh knows targets and moves them."""
    proc = subprocess.run(["./run.sh", "--configfile", "my.yaml", "results/plan.md", "-n", "--forcerun",
                           "results/plan.md"], cwd=project, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "rule plan:" in proc.stdout + proc.stderr and "rule train:" not in proc.stdout + proc.stderr
    typo = subprocess.run(["./run.sh", "config", "--configfile", "my.yml"], cwd=project, capture_output=True,
                          text=True, timeout=120)
    assert typo.returncode == 2 and "'my.yml' follows --configfile but is no config file" in typo.stderr
