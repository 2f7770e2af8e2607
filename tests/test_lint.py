"""Lint as part of the tests: ruff (the rule set in pyproject.toml), snakefmt, snakemake --lint.

snakemake --lint asks every rule for a conda environment or container. The project uses one
pinned venv instead (docs/gpus-and-clusters.md, "Why one venv"), so that lint, and only that one, is accepted.
"""

import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

BIN = Path(sys.executable).parent
ACCEPTED = {"Specify a conda environment or container for each rule."}


def run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_ruff():
    proc = run(str(BIN / "ruff"), "check", "--output-format", "concise", ".")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_snakefmt():
    proc = run(str(BIN / "snakefmt"), "--check", "Snakefile", "rules/")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_snakemake_lint_finds_nothing_but_the_conda_question():
    proc = run(sys.executable, "-m", "snakemake", "--lint")
    lints = set(re.findall(r"^    \* (.+?):$", proc.stdout + proc.stderr, re.M))
    assert lints == ACCEPTED, proc.stdout + proc.stderr  # found (the parsing works), and nothing else
