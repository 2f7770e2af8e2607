"""benchmarks/gpu_check.sh --cpu: the GPU check's own steps (tiny targets, transformers hidden states
at two sizes on rows of mixed lengths, the trainer's probe, every family's training under torchrun and
speculators' own loop, EAGLE-3 at a user's lengths, every family's export) on the CPU with vLLM not
importable, as on the bare GPU machine, so the script cannot rot between the days a GPU is lent
(~3.5 min on 2 cores)."""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.e2e

# Every Python process started with this folder on PYTHONPATH leaves its command line there: on the
# lent machine the carried wheels live on PYTHONPATH, and a subprocess that replaced it lost them.
RECORDER = """import os, sys
with open(os.path.join(os.path.dirname(__file__), "seen", str(os.getpid())), "w") as fh:
    fh.write(" ".join(sys.argv))
"""


def test_the_gpu_check_runs_its_steps_on_a_cpu_without_vllm(tmp_path):
    extra = tmp_path / "extra"
    (extra / "vllm").mkdir(parents=True)
    (extra / "vllm" / "__init__.py").write_text('raise ImportError("vLLM is not installed on this machine")')
    (extra / "seen").mkdir()
    (extra / "sitecustomize.py").write_text(RECORDER)
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(extra)}
    proc = subprocess.run([str(REPO / "benchmarks" / "gpu_check.sh"), "--cpu", "--out", str(tmp_path / "check")],
                          capture_output=True, text=True, timeout=1500, env=env)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "check" / "gpu_check.json").read_text())
    steps = report["steps"]
    assert {name: record["ok"] for name, record in steps.items()} == {
        "extract_small": True, "extract_large": True, "probe": True, "train_eagle3": True, "speculators_loop": True,
        "train_dflash": True, "train_dspark": True, "train_long_compiled": None, "train_long_uncompiled": True,
        "export": True}
    small = steps["extract_small"]["result"]
    assert small["against_cpu"].startswith("min cosine similarity") and small["ratio"] > 0
    assert {"extract_tok_s", "bare_forward_tok_s", "raw_write_tok_s"} <= set(small)
    # Rows of mixed lengths: batches padded (the CPU stages no pinned memory; a GPU reports its peak).
    assert small["row_lengths"][0] < small["row_lengths"][1] and small["padded_tokens"] > small["tokens"]
    assert small["batch_states_bytes"] > 0 and small["pinned_pool_bytes"] == small["pinned_peak_bytes"] == 0
    assert steps["extract_large"]["result"]["hidden"] == 256
    probe = steps["probe"]["result"]
    assert probe["loss_implementation"] == "eager" and "no CUDA" in probe["reason"]
    phases = steps["train_eagle3"]["result"]["phases"]
    assert {"launch_s", "build_s", "first_step_s", "first_validation_s", "done_s", "exit_s"} <= set(phases)
    for family in ("dflash", "dspark"):  # each block family probed (eager here) and trained with sdpa
        trained = steps[f"train_{family}"]["result"]
        assert trained["family"] == family and trained["draft_attention"] == "sdpa" and trained["phases"]["steps"]
    for step in ("train_eagle3", "train_dflash", "train_dspark"):  # each epoch replayed as a server drafts
        trained = steps[step]["result"]
        assert len(trained["predicted_served_tau"]) == len(trained["simulated_tau"]) > 0 and trained["replay_s"], step
        assert trained["replay_expected"] is True, step  # sampled answers: expected acceptance through the head
    assert "predicted_served_tau" not in steps["train_long_uncompiled"]["result"]  # a throughput step only
    assert steps["train_long_uncompiled"]["result"]["draft_attention"] == "sdpa"
    assert "speculators compiles only on CUDA" in steps["train_long_compiled"]["not_run"]
    assert all(record.get("peak_gpu_mib") is None for record in steps.values())  # no nvidia-smi here
    exported = steps["export"]["result"]
    assert exported["eagle3"]["head_moved"] > 0 and {exported[f]["type"] for f in exported} == {
        "eagle3", "dflash", "dspark"}
    assert "not installed on this machine" in report["not_run"] and "Traceback" not in out
    seen = [(extra / "seen" / pid).read_text() for pid in os.listdir(extra / "seen")]
    for expected in ("--step extract_small", "--step speculators_loop", "--step train_dspark", "speculators_loop.py",
                     "draftsmith.training.train"):  # torchrun's ranks; on a CPU no probe process starts
        assert any(expected in argv for argv in seen), f"no process with {expected!r} kept PYTHONPATH"


def test_the_gpu_check_without_cuda_says_so():
    proc = subprocess.run([str(REPO / "benchmarks" / "gpu_check.sh")], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHON": sys.executable})
    assert proc.returncode == 3 and "no CUDA device here; run with --cpu" in proc.stdout, proc.stdout + proc.stderr


def test_a_step_past_its_limit_is_ended_and_says_where_the_trainer_was(tmp_path):
    """On the H200 a training run went silent for minutes: the step is ended at its limit (its children
    too) and the record keeps the phases the trainer had logged, the next steps still run."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_check

    (tmp_path / "steps").mkdir()
    (tmp_path / "train_eagle3").mkdir()
    (tmp_path / "train_eagle3" / "phases.json").write_text('{"launch_s": 30.0, "build_s": 2.0}')
    # A limit of 0 s: the step is past it whatever this machine's speed (with 1 s, a fast machine imported
    # torch, found no data and wrote its failure in time, and the limit was never reached).
    record = gpu_check.run_isolated("train_eagle3", tmp_path, cpu=True, processes=1, limit_s=0)
    assert record["ok"] is False and "no result within its limit of 0 s" in record["error"]
    assert record["phases"] == {"launch_s": 30.0, "build_s": 2.0}
