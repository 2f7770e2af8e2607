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


def test_reevaluate_serves_the_draft_length_the_pick_chose(tmp_path, monkeypatch):
    """It served every run's drafter at the first of evaluation.num_speculative_tokens, not the picked one: a
    run picked at k=5 was re-measured at k=1."""
    import contextlib
    import importlib
    import json
    from types import SimpleNamespace

    sys.path.insert(0, str(REPO / "benchmarks"))
    reevaluate = importlib.import_module("reevaluate")
    run = tmp_path / "runs" / "a-seed0"
    (run / "results" / "evaluation").mkdir(parents=True)
    (run / "results" / "drafter").mkdir(parents=True)
    (run / "results" / "evaluation" / "results.json").write_text(json.dumps({"pick": {"k": 5}}))
    (run / "results" / "drafter" / "config.json").write_text(json.dumps({"speculators_model_type": "eagle3"}))
    served = []

    @contextlib.contextmanager
    def server(spec, log):
        served.append(spec.speculative_config["num_speculative_tokens"])
        yield SimpleNamespace(base_url="http://x/v1")

    monkeypatch.setattr(reevaluate, "managed_server", server)
    monkeypatch.setattr(reevaluate.ev, "warm_up", lambda *args: None)
    monkeypatch.setattr(reevaluate.ev, "prompt_sets", lambda evaluation, base: {})
    monkeypatch.chdir(tmp_path)
    from draftsmith.config.load import EMBEDDED, WORKFLOW_DIR, load_layers, validate_config

    config = validate_config(load_layers([WORKFLOW_DIR / EMBEDDED], {}))
    evaluation = {**config["evaluation"], "num_speculative_tokens": [1, 3, 5]}
    reevaluate.measure_run(run, config, evaluation, [0.0], 1, 16)
    assert served == [5]


def test_a_recipe_reads_the_shared_preflight_and_checks_its_own_drafter_shape():
    """results/checks was shared whole, but the shared run never builds the engine check the pick reads (and a
    recipe's drafter shape is its own): every recipe's dry run planned it in the shared folder and was
    refused. The dry-run path itself runs in the e2e tests (tests/e2e/test_workflow.py)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import importlib

    recipes = importlib.import_module("recipes")
    recipes.refuse_shared_reruns(REPO, ["results/checks/engine.cpu.json", "results/train/eagle3/training.json"])
    try:
        recipes.refuse_shared_reruns(REPO, ["results/checks/preflight.json"])
    except SystemExit as err:
        assert "would redo shared results (results/checks/preflight.json)" in str(err)
    else:
        raise AssertionError("a rerun of the shared preflight was not refused")
