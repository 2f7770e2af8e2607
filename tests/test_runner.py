from pathlib import Path
from types import SimpleNamespace

from draftsmith.ops.runner import base_dir


def test_the_workflow_folder_is_named_without_the_rules_detour():
    # Snakemake hands a script `<repo>/rules/../scripts`: relative prompt paths start at <repo>, and a
    # reject message names `<repo>/../shared/x.jsonl`, not `<repo>/rules/../../shared/x.jsonl`.
    sm = SimpleNamespace(scriptdir="/repo/rules/../scripts")
    assert base_dir(sm) == Path("/repo")
    assert str(base_dir(sm) / "../shared/x.jsonl") == "/repo/../shared/x.jsonl"


def test_every_job_adds_its_time_to_its_outputs_ledger_failed_ones_too(tmp_path, monkeypatch):
    import sys

    import pytest

    from draftsmith.ops import runner, spent

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "stderr", sys.stderr)  # run() points stderr at the job's log
    (tmp_path / "logs" / "generate").mkdir(parents=True)
    runner.run(lambda: None, "logs/generate/d.log")

    def fails():
        raise ValueError("a bad row")

    with pytest.raises(SystemExit):
        runner.run(fails, "logs/generate/d.log")
    lines = spent.ledger("logs/generate/d.log").read_text().splitlines()
    assert spent.ledger("logs/generate/d.log") == Path("results/timings/spent/generate/d.jsonl") and len(lines) == 2
