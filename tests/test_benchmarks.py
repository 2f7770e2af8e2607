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


def test_the_gpu_check_wheels_download_in_a_copy_that_is_no_git_checkout(tmp_path):
    """A release tarball or a copied folder has no .git: the script appended to .git/info/exclude under
    set -e and failed before downloading anything. pip is replaced by a stand-in that writes one wheel
    per package asked for (no network in tests)."""
    import os
    import shutil

    copy = tmp_path / "draftsmith"
    (copy / "envs").mkdir(parents=True)
    for name in ("gpu-check-wheels.sh", "constraints-cpu.txt"):
        shutil.copy(REPO / "envs" / name, copy / "envs" / name)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text('#!/usr/bin/env bash\n'
                                     'dest=$(printf "%s\\n" "$@" | grep -A1 -x -- -d | tail -1)\n'
                                     'for a in "$@"; do [[ $a == *==* || $a =~ ^[a-z] ]] && '
                                     'touch "$dest/${a%%=*}.whl"; done; exit 0\n')
    (bin_dir / "python3").chmod(0o755)
    proc = subprocess.run(["bash", "envs/gpu-check-wheels.sh"], cwd=copy, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert proc.returncode == 0, proc.stderr
    wheels = {p.name for p in (copy / ".whl").glob("*.whl")}
    assert {"speculators.whl", "attrs.whl", "jsonschema.whl", "xxhash.whl"} <= wheels, wheels
    assert not (copy / ".git").exists()
