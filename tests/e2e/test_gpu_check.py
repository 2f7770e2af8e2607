"""benchmarks/gpu_check.sh on a machine without CUDA: every step that needs no GPU is valid (config,
DAG), then it stops with a clear message, not a traceback."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.e2e


def test_the_gpu_check_stops_cleanly_without_cuda(workdir, tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_WORKDIR": str(tmp_path),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run([str(REPO / "benchmarks" / "gpu_check.sh"), str(workdir / "results" / "tokenized")],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "gpu_check: dry run: ok" in proc.stderr and "no CUDA device here" in proc.stderr
    assert "Traceback" not in proc.stderr
    planned = (tmp_path / "dry_run.log").read_text()
    assert "rule train:" in planned and "rule hidden_states:" in planned and "rule generate:" not in planned
