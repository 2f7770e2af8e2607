"""Benchmarks are not run by the tests (they measure speed), but they must keep working as the
package changes: each one is imported and asked for its usage."""

import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.parametrize("script", sorted(p.name for p in (REPO / "benchmarks").glob("*.py")))
def test_benchmark_starts(script):
    proc = subprocess.run([sys.executable, f"benchmarks/{script}", "--help"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage:" in proc.stdout
