"""The worked configs in config/examples/ as a user runs them before any GPU time: a dry run,
`./run.sh config` and results/plan.md, on a copy of the workflow that holds their prompt files
and a local Hugging Face cache that holds their targets' config and tokenizer (no weights)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

EXAMPLES = sorted((REPO / "config" / "examples").glob("*.yaml"))
# The targets' real shapes (config.json), so the preflight and the plan see what users' runs see.
TARGETS = {
    "Qwen/Qwen3-8B": {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 36,
                      "hidden_size": 4096, "vocab_size": 151936, "max_position_embeddings": 40960},
    "Qwen/Qwen3-32B": {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 64,
                       "hidden_size": 5120, "vocab_size": 151936, "max_position_embeddings": 40960},
    "moonshotai/Kimi-K2.5": {"model_type": "kimi_k25", "architectures": ["KimiK25ForConditionalGeneration"],
                             "auto_map": {"AutoConfig": "configuration_kimi_k25.KimiK25Config"},
                             "text_config": {"model_type": "deepseek_v3", "num_hidden_layers": 61, "hidden_size": 7168,
                                             "vocab_size": 163840, "max_position_embeddings": 262144}},
}


@pytest.fixture(scope="module")
def hub_cache(tokenizer, tmp_path_factory) -> Path:
    """A Hugging Face cache as a download leaves it, with config.json and a tokenizer per target."""
    cache = tmp_path_factory.mktemp("hf-cache")
    for repo_id, config in TARGETS.items():
        snapshot = cache / f"models--{repo_id.replace('/', '--')}" / "snapshots" / ("0" * 40)
        snapshot.mkdir(parents=True)
        (snapshot / "config.json").write_text(json.dumps(config))
        tokenizer.save_pretrained(snapshot)
        (snapshot.parents[1] / "refs").mkdir()
        (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
    return cache


@pytest.fixture(scope="module")
def workflow(tmp_path_factory) -> Path:
    """The workflow folder with the examples' prompt files (relative sources resolve there)."""
    copy = tmp_path_factory.mktemp("workflow")
    for name in ("Snakefile", "rules", "scripts", "config", "report"):
        (shutil.copytree if (REPO / name).is_dir() else shutil.copy)(REPO / name, copy / name)
    for example in EXAMPLES:
        config = yaml.safe_load(example.read_text())
        for name, entry in config["datasets"].items():  # distinct prompts: later datasets drop repeats
            (copy / entry["source"]).parent.mkdir(parents=True, exist_ok=True)
            (copy / entry["source"]).write_text("".join(json.dumps(prompt_row(name, i, entry.get("workload")))
                                                        + "\n" for i in range(64)))
        for entry in config["evaluation"]["prompt_sets"].values():
            if entry["source"].startswith("bfcl:"):  # read from the bfcl-eval package
                continue
            shutil.copy(REPO / "config" / "prompts" / "bench_everyday.jsonl", copy / entry["source"])
    return copy


def prompt_row(dataset: str, i: int, workload: str | None) -> dict:
    """A row of the example's dataset: a prompt, or for a tool set an OpenAI conversation with its tool, call
    and result."""
    question = f"Question {i} for the {dataset} set: explain step {i}."
    if workload not in ("tools", "agent"):
        return {"id": f"{dataset}-{i}", "prompt": question}
    tool = {"type": "function", "function": {"name": "lookup", "description": "Look a step up.", "parameters": {
        "type": "object", "properties": {"step": {"type": "integer"}}, "required": ["step"]}}}
    call = {"id": "c0", "type": "function", "function": {"name": "lookup", "arguments": json.dumps({"step": i})}}
    return {"id": f"{dataset}-{i}", "tools": [tool], "messages": [
        {"role": "user", "content": question}, {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c0", "content": f"Step {i} is documented."},
        {"role": "assistant", "content": f"Step {i} is documented."}]}


def run(workflow: Path, hub_cache: Path, workdir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_CACHE": str(hub_cache), "HF_HUB_OFFLINE": "1", "TARGET_API_KEY": "not-a-key"}
    return subprocess.run([sys.executable, "-m", "snakemake", "-s", str(workflow / "Snakefile"), "-d", str(workdir),
                           "--cores", "2", *args], capture_output=True, text=True, timeout=600, env=env)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_a_worked_example_dry_runs_and_plans_before_any_gpu_time(example, workflow, hub_cache, tmp_path):
    config = workflow / "config" / "examples" / example.name
    proc = run(workflow, hub_cache, tmp_path, "--configfile", str(config), "-n")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "train" in proc.stdout and "evaluate" in proc.stdout
    proc = run(workflow, hub_cache, tmp_path, "results/plan.md", "--configfile", str(config))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    plan = (tmp_path / "results" / "plan.md").read_text()
    facts = TARGETS[yaml.safe_load(example.read_text())["target"]["source"]]
    assert f"Target: {(facts.get('text_config') or facts)['num_hidden_layers']} layers" in plan, plan
    for name in yaml.safe_load(example.read_text())["datasets"]:
        assert f"| {name} | 64 |" in plan, plan  # every prompt counted (none lost to decontamination)
    for family in yaml.safe_load(example.read_text())["train"].get("families", ["eagle3"]):
        assert f"| train {family} |" in plan and f"\n| {family} |" in plan, plan  # its training and its GPU memory
    printed = subprocess.run([sys.executable, "-m", "draftsmith.config.load", "--configfile", str(config)],
                             capture_output=True, text=True, timeout=120, check=True).stdout
    effective = yaml.safe_load(printed)
    assert effective["target"] == {**yaml.safe_load(example.read_text())["target"], **effective["target"]}
    assert f"# {config}" in printed and "# default" in printed
    assert "--enforce-eager" not in printed and "VLLM_CPU" not in printed


def planned_resources(dry_run: str) -> dict[str, dict]:
    """Each planned rule's threads and resources, as `snakemake -n` prints them."""
    jobs: dict[str, dict] = {}
    for block in dry_run.split("\nrule ")[1:]:
        rule = block.split(":", 1)[0]
        fields = dict(line.strip().split(": ", 1) for line in block.splitlines()[1:] if ": " in line)
        resources = dict(item.split("=", 1) for item in fields.get("resources", "").split(", ") if "=" in item)
        jobs[rule] = {"threads": int(fields.get("threads", 1)),
                      **{k: int(v) if v.isdigit() else v for k, v in resources.items()}}
    return jobs


def test_an_8_gpu_job_reaches_slurm_as_one_task_for_as_long_as_its_server_may_load(workflow, hub_cache, tmp_path):
    """The sbatch line snakemake-executor-plugin-slurm builds for each GPU job of the Kimi-K2.5 example
    (8-GPU servers, startup_timeout_s 3600): one task holding all its GPUs (the plugin's default
    --ntasks-per-gpu=1 made eight 1-GPU tasks), and a time limit that covers the server's start."""
    from types import SimpleNamespace

    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    config = workflow / "config" / "examples" / "finetune.yaml"
    proc = run(workflow, hub_cache, tmp_path, "--configfile", str(config), "-n")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    jobs = planned_resources(proc.stdout)
    startup_min = yaml.safe_load(config.read_text())["server"]["startup_timeout_s"] / 60
    for rule, gpus in {"hidden_states": 8, "export": 8, "evaluate": 8, "train": 1}.items():
        resources = jobs[rule]
        job = SimpleNamespace(name=rule, threads=resources["threads"], resources=type("R", (dict,), {
            "__getattr__": dict.__getitem__})(resources))
        call = get_submit_command(job, {"run_uuid": "u", "slurm_logfile": "log", "comment_str": f"rule_{rule}",
                                        "account": "", "partition": "", "workdir": "."}) + set_gres_string(job)
        assert f"--gpus={gpus}" in call and "--ntasks-per-gpu" not in call and "--ntasks=" not in call, call
        if rule != "train":  # every server job may wait an hour for its server before any work
            assert resources["runtime"] >= 60 + startup_min, (rule, resources)


def test_a_finished_project_moved_to_another_folder_reruns_nothing(workflow, tmp_path):
    """Inputs inside the project were recorded as absolute paths: a project copied or mounted elsewhere
    saw "Set of input files has changed" and reran from the prompts on, training included."""
    first = tmp_path / "first" / "project"
    shutil.copytree(workflow, first, symlinks=True)
    target = "results/prompts/everyday.jsonl"  # the embedded default's first job that reads the project's files

    def snakemake(project: Path, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "snakemake", "-s", str(project / "Snakefile"), "-d", str(project),
                               "--cores", "1", target, *args], capture_output=True, text=True, timeout=600)

    done = snakemake(first)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    moved = tmp_path / "elsewhere" / "project"
    shutil.copytree(first, moved, symlinks=True)
    shutil.rmtree(first)
    plan = snakemake(moved, "-n")
    assert plan.returncode == 0 and "Nothing to be done" in plan.stdout + plan.stderr, plan.stdout[-3000:]


def test_the_slurm_profiles_time_limit_example_names_real_rules():
    """The commented set-resources example in profiles/slurm/config.yaml, uncommented, is a mapping of this
    workflow's rules to runtimes (a renamed rule would leave users' copies setting nothing)."""
    text = (REPO / "profiles" / "slurm" / "config.yaml").read_text()
    example = yaml.safe_load("\n".join(line[4:] for line in text.splitlines() if re.match(r"#   \w+: \{", line)))
    rules = {line.split()[1].rstrip(":") for smk in (REPO / "rules").glob("*.smk")
             for line in smk.read_text().splitlines() if line.startswith("rule ")}
    assert example and set(example) <= rules, (set(example) - rules)
    assert all(isinstance(limits["runtime"], int) for limits in example.values())
