"""redo deletes paid-for work: never on a preview, never for a typo, not without asking."""

import os

import pytest

from draftsmith.ops import redo, spent
from tests.conftest import REPO


@pytest.fixture
def work(tmp_path, monkeypatch):
    """A results folder with one dataset's answers and hidden states; snakemake is not started."""
    journal = tmp_path / "results" / "responses" / ".journal"
    journal.mkdir(parents=True)
    (journal / "everyday-0123456789ab.jsonl").write_text("x" * 5000)
    (tmp_path / "results" / "responses" / "everyday.jsonl").write_text("y" * 100)
    (tmp_path / "results" / "responses" / "humaneval.jsonl").write_text("z")
    # A generation resumed twice: three jobs, the last a short one (Snakemake's benchmark holds only it).
    timings = tmp_path / "results" / "timings" / "generate"
    timings.mkdir(parents=True)
    (timings / "everyday.tsv").write_text("s\th:m:s\n240.0\t0:04:00\n")
    monkeypatch.chdir(tmp_path)  # jobs run in the project folder
    for seconds in (1800, 1560.5, 240):
        spent.add("logs/generate/everyday.log", seconds)
    execs = []
    monkeypatch.setattr(os, "execv", lambda exe, args: execs.append(args))
    monkeypatch.chdir(REPO)
    return tmp_path, execs


@pytest.mark.parametrize("preview", ["-n", "-np", "-pn", "--dry-run"])
def test_a_dry_run_deletes_nothing_and_says_what_would_go(work, capsys, preview):
    tmp, execs = work
    redo.main(["answers", "everyday", preview, "-d", str(tmp)])
    assert (tmp / "results" / "responses" / ".journal" / "everyday-0123456789ab.jsonl").exists()
    err = capsys.readouterr().err
    assert "would remove results/responses/.journal/everyday-0123456789ab.jsonl (4.9 KiB)" in err
    assert "nothing deleted" in err and "made in 60.0 min" in err
    assert execs[0][-2:] == ["--forcerun", "results/responses/everyday.jsonl"] and preview in execs[0]


@pytest.mark.parametrize("directory", [["-d", "{}"], ["--directory", "{}"], ["--directory={}"]])
def test_redoing_a_dataset_leaves_the_journal_of_one_whose_name_it_prefixes(work, capsys, directory):
    """Snakemake's three spellings of the folder all reach the project they name (``--directory=``
    was read as the current folder: a redo there deletes another project's work)."""
    tmp, _ = work
    other = tmp / "results" / "responses" / ".journal" / "everyday-v2-fedcba987654.jsonl"
    other.write_text("paid for\n")  # the journals of dataset everyday-v2 (everyday-* matched it)
    redo.main(["answers", "everyday", "--yes", *(a.format(tmp) for a in directory)])
    assert other.exists() and not (tmp / "results" / "responses" / ".journal" / "everyday-0123456789ab.jsonl").exists()


@pytest.mark.parametrize("argv, message", [
    (["answers", "everydya"], "unknown dataset 'everydya'; the config has everyday, humaneval"),
    (["answer", "everyday"], "unknown stage 'answer'"),
])
def test_a_typo_is_refused_before_anything_runs(work, argv, message):
    tmp, execs = work
    with pytest.raises(SystemExit, match=message):
        redo.main([*argv, "-d", str(tmp)])
    assert not execs and (tmp / "results" / "responses" / "everyday.jsonl").exists()


def test_hours_of_work_are_not_deleted_without_a_yes(work, monkeypatch, capsys):
    """An hour of work over three jobs asks first, though the last job took four minutes."""
    tmp, execs = work
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    with pytest.raises(SystemExit, match=r"\(3 path\(s\), 5.0 KiB, made in 60.0 min\) would be deleted; add --yes"):
        redo.main(["answers", "everyday", "-d", str(tmp)])
    assert not execs and (tmp / "results" / "responses" / "everyday.jsonl").exists()
    redo.main(["answers", "everyday", "--yes", "-d", str(tmp)])
    assert not (tmp / "results" / "responses" / "everyday.jsonl").exists()
    assert (tmp / "results" / "responses" / "humaneval.jsonl").exists()  # another dataset: untouched
    assert "--yes" not in execs[0] and "removed results/responses/everyday.jsonl" in capsys.readouterr().err


def test_a_users_configfile_decides_which_datasets_exist(work, tmp_path):
    tmp, _ = work
    user = tmp_path / "user.yaml"
    user.write_text("datasets:\n  mine: {source: config/prompts/everyday.jsonl}\n")
    with pytest.raises(SystemExit, match="unknown dataset 'everyday'; the config has mine"):
        redo.main(["answers", "everyday", "--configfile", str(REPO / "config" / "config.yaml"), str(user), "-d",
                   str(tmp)])


def test_config_entries_on_the_command_line_count_like_snakemakes(work, tmp_path):
    # --config replaces the datasets as in the Snakefile (datasets are replaced, not merged)
    tmp, _ = work
    mine = "datasets={mine: {source: config/prompts/everyday.jsonl}}"
    with pytest.raises(SystemExit, match="unknown dataset 'everyday'; the config has mine"):
        redo.main(["answers", "everyday", "--config", mine, "-d", str(tmp)])
    with pytest.raises(SystemExit, match="--config: Invalid config definition"):
        redo.main(["answers", "everyday", "--config", "no-equals-sign", "-d", str(tmp)])
