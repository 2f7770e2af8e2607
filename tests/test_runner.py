from pathlib import Path
from types import SimpleNamespace

from draftsmith.runner import base_dir


def test_the_workflow_folder_is_named_without_the_rules_detour():
    # Snakemake hands a script `<repo>/rules/../scripts`: relative prompt paths start at <repo>, and a
    # reject message names `<repo>/../shared/x.jsonl`, not `<repo>/rules/../../shared/x.jsonl`.
    sm = SimpleNamespace(scriptdir="/repo/rules/../scripts")
    assert base_dir(sm) == Path("/repo")
    assert str(base_dir(sm) / "../shared/x.jsonl") == "/repo/../shared/x.jsonl"
