"""One real workflow run (9-15 min on 2 cores, by machine), shared by every end-to-end test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

CONFIG = REPO / "tests" / "e2e" / "config.yaml"


def snakemake(workdir: Path, *args: str, config: Path = CONFIG) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(workdir),
           "--configfile", str(config), "--cores", "2", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=1800)


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    """A fresh run; DRAFTSMITH_E2E_WORKDIR names a folder to reuse across sessions while developing
    (Snakemake then redoes only what is stale there)."""
    reuse = os.environ.get("DRAFTSMITH_E2E_WORKDIR")
    work = Path(reuse) if reuse else tmp_path_factory.mktemp("workflow")
    proc = snakemake(work)
    if proc.returncode != 0:
        logs = "\n".join(f"== {p}\n{p.read_text()[-3000:]}" for p in sorted((work / "logs").rglob("*.log")))
        pytest.fail(f"workflow failed:\n{proc.stderr[-5000:]}\n{logs}")
    return work
