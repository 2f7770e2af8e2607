"""benchmarks/gpu_check.sh --cpu: the GPU check's own steps (tiny target, transformers hidden states,
speculators training under torchrun, export) on the CPU with vLLM not importable, as on the bare GPU
machine, so the script cannot rot between the days a GPU is lent (2 min on 2 cores)."""

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.e2e


def test_the_gpu_check_runs_its_steps_on_a_cpu_without_vllm(tmp_path):
    blocker = tmp_path / "no-vllm" / "vllm"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text('raise ImportError("vLLM is not installed on this machine")')
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(blocker.parent)}
    proc = subprocess.run([str(REPO / "benchmarks" / "gpu_check.sh"), "--cpu", "--out", str(tmp_path / "check")],
                          capture_output=True, text=True, timeout=900, env=env)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert "hidden states against the CPU's: min cosine similarity" in out
    assert "bare forward pass" in out and "speculators' own loop" in out and "2 gloo rank(s)" in out
    assert "export: loads" in out and "draft LM head moved by up to" in out and "moved by up to 0.00e+00" not in out
    assert "not run here: vLLM's steps" in out and "not installed on this machine" in out
    assert "Traceback" not in out


def test_the_gpu_check_without_cuda_says_so():
    proc = subprocess.run([str(REPO / "benchmarks" / "gpu_check.sh")], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHON": sys.executable})
    assert proc.returncode == 3 and "no CUDA device here; run with --cpu" in proc.stdout, proc.stdout + proc.stderr
