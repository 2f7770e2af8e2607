"""benchmarks/recipes.py's table: ratios against the first recipe, spread over seeds, time to quality."""

import base64
import importlib.util

import pytest

from tests.conftest import REPO

spec = importlib.util.spec_from_file_location("recipes", REPO / "benchmarks" / "recipes.py")
recipes = importlib.util.module_from_spec(spec)
spec.loader.exec_module(recipes)


def summary(tau0: float, tau1: float, simulated: list[float], train_s: float, served_by: str) -> dict:
    return {"served_by": served_by, "tau": {("everyday", 0.0): tau0, ("everyday", 1.0): tau1},
            "per_position": {("everyday", 0.0): [0.5, 0.2], ("everyday", 1.0): [0.4, 0.1]},
            "simulated": simulated, "train_s": train_s,
            "epoch_s": [train_s * (i + 1) / len(simulated) for i in range(len(simulated))]}


def test_ratios_spread_and_time_to_quality_are_against_the_first_recipe():
    runs = {"speculators": [summary(1.5, 1.2, [1.1, 1.3], 100, "vLLM, SGLang"),
                            summary(1.7, 1.2, [1.1, 1.3], 100, "vLLM, SGLang")],
            "fc_norm": [summary(1.8, 1.3, [1.35, 1.4], 120, "vLLM"), summary(1.8, 1.1, [1.2, 1.4], 120, "vLLM")]}
    lines = recipes.table(runs)
    reference, fc_norm = (line.split(" | ") for line in lines[2:])
    assert reference[2:4] == ["1.600 ± 0.100", "1.200 ± 0.000"]  # mean ± half the range over seeds
    assert reference[4:6] == ["1.000", "1.000"]
    assert fc_norm[4:6] == ["1.125", "1.000"]  # 1.8 / 1.6 at T=0; 1.2 / 1.2 at T=1
    assert fc_norm[9] == "1.20"  # training time ratio
    assert reference[10] == "epoch 2 (100 s)"  # the reference reaches its own final τ at its end
    assert fc_norm[10] == "epoch 2 (120 s)"  # seed mean 1.275 after epoch 1, 1.4 after 2; the reference's 1.3
    assert reference[11].rstrip(" |") == "vLLM, SGLang" and fc_norm[11].rstrip(" |") == "vLLM"


def test_a_recipe_that_never_reaches_the_reference_says_so():
    assert recipes.time_to_quality([1.0, 1.1], 1.3, [25, 50]) == "not reached"
    assert recipes.time_to_quality([1.0, 1.3], 1.3, [20, 50]) == "epoch 2 (50 s)"


def test_snakemake_reads_the_targets_as_targets_and_every_config(tmp_path):
    """--configfile takes every argument after it: the targets must come first (they were read as
    config files once)."""
    from snakemake.cli import get_argument_parser

    configs = [tmp_path / "base.yaml", tmp_path / "recipe.yaml"]
    argv = recipes.snakemake_command(tmp_path, configs, "results/vocab/d2t.npy", "results/x.json")
    args = get_argument_parser().parse_args(argv[3:])
    assert args.targets == ["results/vocab/d2t.npy", "results/x.json"]
    assert args.configfile == [recipes.EMBEDDED, *configs]


DRY_RUN = """
rule tokenize:
    input: results/models/t, results/responses/codegen.jsonl
    output: results/tokenized/codegen.parquet, results/tokenized/codegen.rejects.jsonl
    jobid: 7
    wildcards: generated=codegen

rule train:
    input: results/merged/train.parquet
    output: results/train/training.json
    jobid: 2
"""


def test_a_recipe_run_that_would_redo_shared_results_is_refused_before_anything_runs(tmp_path):
    # Its links lead into the shared folder: a tokenize job there had deleted codegen's tokens.
    planned = recipes.planned_outputs(DRY_RUN)
    assert planned == ["results/tokenized/codegen.parquet", "results/tokenized/codegen.rejects.jsonl",
                       "results/train/training.json"]
    with pytest.raises(SystemExit, match=r"would redo shared results \(results/tokenized/codegen\.parquet"):
        recipes.refuse_shared_reruns(tmp_path, planned)
    recipes.refuse_shared_reruns(tmp_path, ["results/train/training.json", "results/evaluation/results.json"])


def test_a_folder_keeps_its_own_records_of_what_it_makes(tmp_path):
    """shared-fp8 makes its hidden states itself: the shared folder's records of them (bf16 params)
    copied over its own made Snakemake rerun the fp8 hidden-state jobs at every seed."""

    def record(folder, output, text):
        b64 = base64.urlsafe_b64encode(output.encode()).decode()
        path = folder / ".snakemake" / "metadata" / b64
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    shared, fp8 = tmp_path / "shared", tmp_path / "shared-fp8"
    record(shared, "results/merged/train.parquet", "shared merge")
    record(shared, "results/hidden_states/a/manifest.json", "bf16")
    own = record(fp8, "results/hidden_states/a/manifest.json", "fp8")
    recipes.copy_records(shared, fp8, ("results/merged",))
    assert own.read_text() == "fp8"
    copied = fp8 / ".snakemake" / "metadata" / base64.urlsafe_b64encode(b"results/merged/train.parquet").decode()
    assert copied.read_text() == "shared merge"


def test_each_recipe_shows_its_speedup_and_drafter_size_over_seeds():
    runs = {"eagle3": [{**summary(1.5, 1.2, [1.3], 60, "vLLM"), "speedup": 1.2, "drafter_mib": 72.8},
                       {**summary(1.5, 1.2, [1.3], 60, "vLLM"), "speedup": 1.4, "drafter_mib": 72.8}],
            "dflash": [{**summary(1.4, 1.1, [1.2], 90, "vLLM"), "speedup": None, "drafter_mib": 24.5}]}
    eagle3, dflash = (line.split(" | ") for line in recipes.table(runs)[2:])
    assert eagle3[12:14] == ["1.300 ± 0.100", "72.8 ± 0.0 |"]
    assert dflash[12] == "–"  # a run without a measured speed-up has none, not a mean of the others
