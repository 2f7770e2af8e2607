"""./run.sh status reads what the jobs write, and reads a journal only once."""

import json

import pytest

from draftsmith.config.load import from_snakemake_args
from draftsmith.ops import status
from tests.conftest import REPO


def record(i, tokens=10, state="ok"):
    return json.dumps({"format": 2, "id": f"p{i}", "status": state, "usage": {"completion_tokens": tokens}}) + "\n"


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".snakemake").mkdir()
    (tmp_path / "results/prompts").mkdir(parents=True)
    (tmp_path / "results/prompts/everyday.jsonl").write_text("{}\n" * 64)
    journal = tmp_path / "results/responses/.journal/everyday-0123456789ab.jsonl"
    journal.parent.mkdir(parents=True)
    journal.write_text("".join(record(i) for i in range(20)) + record(20, state="dropped"))
    (tmp_path / "logs/generate").mkdir(parents=True)
    (tmp_path / "logs/generate/everyday.log").write_text(
        "start\neveryday:  30%|███  | 21/64 [01:08<02:52,  4.02s/rec]\reveryday:  33%|███  | 22/64 [01:10<02:50]")
    return tmp_path


def test_counts_come_from_the_journal_and_eta_from_the_running_job(run_dir):
    config = from_snakemake_args([], REPO)
    st = status.collect(config)
    everyday = next(d for d in st.datasets if d.name == "everyday")
    assert (everyday.prompts, everyday.answered, everyday.dropped, everyday.completion_tokens) == (64, 20, 1, 200)
    assert everyday.progress.startswith("everyday:  33%") and "22/64 [01:10<02:50]" in everyday.progress
    text = status.render(st)
    assert "everyday" in text and "results/drafter/final.safetensors" in text.split("still missing:")[1]


def test_a_journal_is_read_incrementally(run_dir, monkeypatch):
    config = from_snakemake_args([], REPO)
    status.collect(config)
    journal = run_dir / "results/responses/.journal/everyday-0123456789ab.jsonl"
    with journal.open("a") as fh:
        fh.write(record(21, tokens=5) + record(22, tokens=5)[:20])  # the second is still being written
    seen = []
    original = status.json.loads
    monkeypatch.setattr(status.json, "loads", lambda text: seen.append(text) or original(text))
    everyday = next(d for d in status.collect(config).datasets if d.name == "everyday")
    assert everyday.answered == 21 and everyday.completion_tokens == 205
    journal_lines = [s for s in seen if isinstance(s, bytes)]
    assert len(journal_lines) == 1  # only the record appended since the last call was parsed
    with journal.open("a") as fh:
        fh.write(record(22, tokens=5)[20:])
    assert next(d for d in status.collect(config).datasets if d.name == "everyday").answered == 22


def turn(trajectory, k, tokens=10, state="ok"):
    return json.dumps({"format": 2, "id": f"{trajectory}#{k}", "trajectory": trajectory, "turn": k, "status": state,
                       "usage": {"completion_tokens": tokens}}) + "\n"


def test_a_trajectory_set_counts_trajectories_and_every_turns_tokens(run_dir):
    """Issue 58: a trajectory's turns are records of their own, but the set's progress is in trajectories, as
    max_samples counts them (one ended at the context counts; one whose first turn did not fit is dropped),
    and its tokens every turn's, as the budget counts them."""
    journal = run_dir / "results/responses/.journal/everyday-0123456789ab.jsonl"
    journal.write_text(turn("t0", 0) + turn("t0", 1) + turn("t0", 2) + turn("t1", 0, tokens=7)
                       + turn("t1", 1, state="dropped_context") + turn("t2", 0, state="dropped_context"))
    everyday = next(d for d in status.collect(from_snakemake_args([], REPO)).datasets if d.name == "everyday")
    assert (everyday.answered, everyday.dropped, everyday.completion_tokens) == (2, 1, 37)


def test_a_status_cache_from_before_trajectories_were_counted_is_read_again(run_dir):
    config = from_snakemake_args([], REPO)
    status.collect(config)
    cache = json.loads((run_dir / ".snakemake/draftsmith-status.json").read_text())
    journal_key = next(iter(cache["journals"]))
    cache["journals"][journal_key] = {"offset": cache["journals"][journal_key]["offset"],
                                      "latest": {"p0": [True, 10]}}
    (run_dir / ".snakemake/draftsmith-status.json").write_text(json.dumps(cache))
    assert next(d for d in status.collect(config).datasets if d.name == "everyday").answered == 20


def test_hidden_states_and_training_progress(run_dir):
    folder = run_dir / "results/hidden_states/everyday"
    folder.mkdir(parents=True)
    (folder / "index.jsonl").write_text(json.dumps({"shard": "s0", "rows": {"0": "d", "1": "d"}, "bytes": 2**30})
                                        + "\n")
    for family, metrics in (("eagle3", [{"full_acc_0_epoch": 0.3}, {"full_acc_0_epoch": 0.4}]),
                            ("dflash", [{"eal_epoch": 1.7}])):
        runs = run_dir / f"results/train_runs/{family}/abc"
        runs.mkdir(parents=True)
        (runs / "validation.jsonl").write_text("".join(json.dumps({"epoch": i, **m}) + "\n"
                                                       for i, m in enumerate(metrics)))
    (run_dir / "logs/train").mkdir()
    (run_dir / "logs/train/eagle3.log").write_text("{'train': {}, 'global_step': 11}\n... global_step=12\n")
    st = status.collect(from_snakemake_args(["--config", "train={families: [eagle3, dflash, dspark]}"], REPO))
    eagle3, dflash, _ = st.training
    text = status.render(st)
    assert eagle3.global_step == 12 and "training eagle3: run abc, 2 of 3 epochs validated" in text
    everyday = next(d for d in st.datasets if d.name == "everyday")
    assert everyday.hidden_state_rows == 2 and everyday.hidden_state_bytes == 2**30
    assert eagle3.epochs_validated == 2 and eagle3.best_simulated_tau == pytest.approx(1.4)
    assert dflash.epochs_validated == 1 and dflash.best_simulated_tau == pytest.approx(1.7)
    assert "training dspark: run –, 0 of 3 epochs validated" in text  # each family counted apart


def test_a_prompt_journaled_twice_counts_once(run_dir):
    """A retried failure and a prompt answered again after an edit each leave a second journal line:
    the prompt counts once, by its latest outcome, as generation's resume reads it."""
    journal = run_dir / "results/responses/.journal/everyday-0123456789ab.jsonl"
    with journal.open("a") as fh:
        fh.write(record(20, tokens=7) + record(3, tokens=12))  # p20 dropped then answered; p3 answered again
    config = from_snakemake_args([], REPO)
    everyday = next(d for d in status.collect(config).datasets if d.name == "everyday")
    assert (everyday.answered, everyday.dropped, everyday.completion_tokens) == (21, 0, 20 * 10 - 10 + 12 + 7)


def test_a_finished_training_says_what_chose_its_checkpoint_and_its_figure(run_dir):
    """`./run.sh status` said "best simulated τ 1.307" where the export chose on predicted served τ (1.231)."""
    summary = run_dir / "results/train/eagle3/training.json"
    summary.parent.mkdir(parents=True)
    summary.write_text(json.dumps({"chosen": {"epoch": 1, "simulated_tau": 1.307, "predicted_served_tau": 1.231,
                                              "k": 3, "exactness": {"basis": "exact", "agreement": 1.0}}}))
    runs = run_dir / "results/train_runs/eagle3/abc"
    runs.mkdir(parents=True)
    (runs / "validation.jsonl").write_text(json.dumps({"epoch": 0, "full_acc_0_epoch": 0.307}) + "\n")
    config = from_snakemake_args(["--config", "train={families: [eagle3]}"], REPO)
    text = status.render(status.collect(config))
    assert 'exported epoch 2 (recorded as "epoch": 1, counted from 0) by predicted served τ 1.231 at k=3 (exact)' \
        in text and "1.307" not in text
    summary.write_text(json.dumps({"chosen": {"epoch": 0, "simulated_tau": 1.307, "predicted_missing":
                                              "skipped: online hidden states, none stored to replay on"}}))
    assert ('exported epoch 1 (recorded as "epoch": 0, counted from 0) by simulated τ 1.307 (no predicted served τ: '
            "skipped: online hidden states") \
        in status.render(status.collect(config))


def test_once_picked_status_says_what_was_published_and_what_to_serve_as_the_records_say(run_dir):
    """The pick's figures reached the report and the card only; status now formats the same records, in the
    card's words (a finished project's records, without the newer fields, read the same)."""
    from draftsmith.evaluation.decide.schedule import one_config_text
    from tests import records

    config = from_snakemake_args([], REPO)
    assert status.collect(config).published is None
    results = records.results()
    for files in [(results, records.serving(results), records.GATE),
                  records.finished_before(results, records.serving(results), records.GATE)]:
        for path, record in zip(("results/evaluation/results.json", "results/drafter/serving.json",
                                 "results/drafter/gate.json"), files, strict=True):
            (run_dir / path).parent.mkdir(parents=True, exist_ok=True)
            (run_dir / path).write_text(json.dumps(record))
        text = status.render(status.collect(config))
        said = one_config_text(records.serving(results)["schedule"], results["serving"])
        assert said.startswith("n-gram with 1 draft token") and said in text
        assert f"published EAGLE-3 ({results['pick']['why']}); export gate passed: {records.GATE['verdict']}." in text
