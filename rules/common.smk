import math
import os
import sys
from pathlib import Path

sys.path.insert(0, workflow.basedir)  # the draftsmith package, when not pip-installed

from draftsmith.config import target as targets
from draftsmith.config.load import (
    ConfigError,
    config_files,
    load_layers,
    result_view,
    validate_config,
)
from draftsmith.core import (
    platform as devices,
)  # not `platform`: the Snakefile shares Snakemake's globals
from draftsmith.core.digest import json_digest
from draftsmith.data.chat import tokenize_params
from draftsmith.data.datasets import (
    entry_params,
    evaluation_tool_params,
    generation_tool_params,
    prompt_rows_params,
    tool_params,
)
from draftsmith.evaluation.measure import methods as serving_methods
from draftsmith.ops import engine_check, preflight
from draftsmith.ops.stop import forward_stops_to_jobs
from draftsmith.training import families as drafter_families

# The config is layered here rather than with `configfile:`: the schema's defaults, then the
# user's files (or the embedded default when there are none), then --config (draftsmith/config/load.py).
CONFIG_FILES = config_files(workflow.basedir, workflow.overwrite_configfiles)
try:
    _validated = validate_config(
        load_layers(CONFIG_FILES, dict(workflow.config_settings.config))
    )
except ConfigError as err:
    raise WorkflowError(str(err)) from None
config.clear()
config.update(_validated)
print(
    "draftsmith: config read from the schema's defaults, then "
    + ", ".join(map(str, CONFIG_FILES)),
    file=sys.stderr,
)

BASE_DIR = Path(workflow.basedir)
TARGET = targets.resolve(config["target"], BASE_DIR)
RESULT = result_view(
    config
)  # params are made of this view, so no operational setting reruns a job
DATASETS = sorted(config["datasets"])
BASE_MODEL = config["target"]["base_model"] or (
    TARGET.source if TARGET.kind == "hub" else TARGET.name
)
# Each evaluation set's workload (a label): the report and the card rank the recipe per workload; the pick,
# whose outputs the schedule's serving follows, does not read them, so relabelling remeasures nothing.
WORKLOADS = {
    name: entry["workload"]
    for name, entry in RESULT["evaluation"]["prompt_sets"].items()
}
# The datasets as the card names them, without their workload labels and the generation settings added unset
DATASET_ENTRIES = {
    name: entry_params(entry) for name, entry in RESULT["datasets"].items()
}
# A setting added since a project ran (its default unset), and a label, must not change that project's digest.
CONFIG_DIGEST = json_digest(
    {
        **RESULT,
        "target": {
            k: v
            for k, v in RESULT["target"].items()
            if not (k == "tool_call_parser" and v is None)
        },
        "tokenize": tokenize_params(RESULT["tokenize"])
        | {
            k: v
            for k, v in RESULT["tokenize"].items()
            if k == "tool_rendering" and v != "template"
        },
        "datasets": DATASET_ENTRIES,
        "evaluation": serving_methods.grid_settings(RESULT["evaluation"])
        | {
            k: v
            for k, v in RESULT["evaluation"].items()
            if k not in serving_methods.GRID_KEYS
        },
    },
    16,
)
GENERATED = [d for d in DATASETS if config["datasets"][d]["kind"] == "prompts"]
PRETOKENIZED = [d for d in DATASETS if config["datasets"][d]["kind"] == "tokenized"]

_problems = preflight.problems(config, TARGET, BASE_DIR, targets.cheap_facts(TARGET))
if _problems:
    raise WorkflowError(str(preflight.PreflightError(_problems)))
for _notice in preflight.notices(config, BASE_DIR):
    print(f"draftsmith: {_notice}", file=sys.stderr)


def target_input(wildcards=None):
    """The target as a job input: the prepared folder (GGUF) or the local folder; nothing for hub ids."""
    return [TARGET.model] if TARGET.kind != "hub" else []


def project_path(path):
    """``path`` as Snakemake records it: relative when it lies in the working folder (the project), so
    a finished project moved or mounted elsewhere has the same input sets and reruns nothing.
    """
    path = Path(path)
    return (
        str(path.relative_to(Path.cwd()))
        if path.is_relative_to(Path.cwd())
        else str(path)
    )


def gguf_input(wildcards=None):
    """A local .gguf target as prepare_target's input (a package's GGUF moves with the venv)."""
    return [] if TARGET.source.startswith("package:") else [project_path(TARGET.source)]


def local_file(source):
    """A prompt source as a job input when it is a local path (so edits rerun what reads it)."""
    path = preflight.local_source(source, BASE_DIR)
    return [project_path(path)] if path is not None else []


def dataset_source(wildcards):
    name = getattr(wildcards, "generated", None) or wildcards.pretokenized
    return local_file(config["datasets"][name]["source"])


def evaluation_sources(wildcards=None):
    return [
        f
        for entry in config["evaluation"]["prompt_sets"].values()
        for f in local_file(entry["source"])
    ]


def earlier_sources(wildcards):
    """Sources of the datasets before this one: a prompt they hold is dropped from this one."""
    if not config["decontamination"]["dedupe_across_datasets"]:
        return []
    return [
        f
        for d in GENERATED
        if d < wildcards.generated
        for f in local_file(config["datasets"][d]["source"])
    ]


SOURCE_KEYS = (
    "source",
    "format",
    "prompt_field",
    "id_field",
    "skip",
    "max_samples",
    "max_prompt_chars",
    "tools",
)


def source_slice(entry):
    # tools has no default: in a job's params only where set, so a finished project reruns nothing; nor has
    # generation.history, which decides whether the prompts keep the dataset's answers
    history = (entry.get("generation") or {}).get("history")
    return {k: entry[k] for k in SOURCE_KEYS if k in entry} | (
        {"history": history} if history else {}
    )


def prompts_params(wildcards):
    earlier = [d for d in GENERATED if d < wildcards.generated]
    return {
        # a tool set's rows as generation reads them back (datasets.prompt_rows_params)
        "dataset": source_slice(config["datasets"][wildcards.generated])
        | prompt_rows_params(config["datasets"][wildcards.generated]),
        "earlier": (
            {d: source_slice(config["datasets"][d]) for d in earlier}
            if config["decontamination"]["dedupe_across_datasets"]
            else {}
        ),
        "evaluation": {
            n: source_slice(e) for n, e in config["evaluation"]["prompt_sets"].items()
        },
        "decontamination": RESULT["decontamination"],
    }


def generation_params(wildcards):
    # workload: a label; the tool settings only where the dataset is a tool workload (datasets.generation_tool_params)
    entry = RESULT["datasets"][wildcards.generated]
    params = {k: v for k, v in entry_params(entry).items() if k not in SOURCE_KEYS}
    return params | generation_tool_params(RESULT, [entry["workload"]])


def tokenize_job_params(wildcards):
    """The tokenize section, with the tool rendering only where the dataset is a tool workload."""
    entry = RESULT["datasets"][wildcards.generated]
    rendering = tool_params(RESULT, [entry["workload"]]).get("tool_rendering")
    settings = tokenize_params(RESULT["tokenize"])
    return settings | ({"tool_rendering": rendering} if rendering else {})


def pretokenized_params(wildcards):
    entry = RESULT["datasets"][wildcards.pretokenized]
    return {
        k: v for k, v in entry.items() if k != "workload"
    }  # a label: relabelling reruns nothing


def generation_model_name():
    """Which model answers: names the generation journal (never a path)."""
    gen = config["generation_server"]
    if gen["mode"] == "external" and gen["served_model"]:
        return gen["served_model"]
    return config["target"]["name"]


def generation_gpus():
    return (
        config["server"]["gpus"]
        if config["generation_server"]["mode"] == "managed"
        else 0
    )


PREFLIGHT = "results/checks/preflight.json"
# Per engine build (vLLM on GPUs or its CPU build): a run moved onto GPUs is checked again there (which
# engine serves is operational: it names the file, never a param). The families configured before any work
# are checked by the preflight, which every expensive job waits for; this job, which reruns when families are
# added, feeds only the pick: Snakemake 9.27 plans nothing downstream of a job it reruns through an ancient()
# input (dag.py masks those jobs, then skips ancient edges), so a check rerun for an added family would have
# run alone and exited 0 (tests/e2e: families added to a finished run), and a new input of the expensive
# jobs would rerun them in every finished project.
ENGINE_CHECK = (
    f"results/checks/engine.{'gpu' if config['server']['gpus'] else 'cpu'}.json"
)
# One family's check before its training (engine_check_family): the families configured at the start are
# checked by the preflight, whose verdicts it reuses; a family added to a finished run is checked there, before
# its training starts.
ENGINE_CHECKED = f"{ENGINE_CHECK.removesuffix('.json')}/{{family}}.json"


def engine_checked(wildcards):
    """A family's check as an input of its training: ancient, so that a check written later reruns nothing,
    and only where the family has not trained without one (a project trained before the check existed keeps its
    set of inputs: a new input would rerun every family's training there)."""
    check = ENGINE_CHECKED.format(family=wildcards.family)
    trained = f"results/train/{wildcards.family}/training.json"
    return (
        [ancient(check)] if Path(check).exists() or not Path(trained).exists() else []
    )


WARM_START = config["train"]["from_pretrained"] is not None
ONLINE = config["hidden_states"]["mode"] == "online"
PRETRAINED = "results/pretrained"


def pretrained_input(wildcards=None):
    """The checked warm-start drafter, when there is one (it decides layers and vocabulary)."""
    return [f"{PRETRAINED}/check.json"] if WARM_START else []


FAMILIES = config["train"]["families"]
TRAINING_FREE = serving_methods.measured_training_free(config["evaluation"])
METHODS = [*FAMILIES, *TRAINING_FREE]  # what the evaluation measures side by side
PICK_AT = config["evaluation"]["pick_at"] or config["evaluation"]["concurrency"][0]


def family_settings(wildcards=None, family=None):
    """One family's training settings (its train job's params): a family added or changed reruns only its own jobs."""
    return drafter_families.settings(RESULT["train"], family or wildcards.family)


def family_pretrained_input(wildcards):
    """The warm-start drafter is an EAGLE-3 one: it feeds that family only."""
    return (
        pretrained_input()
        if wildcards.family == drafter_families.DEFAULT_FAMILY
        else []
    )


# How the evaluation sets' tools reach the target and the reasoning their history is sent with, where a set is a
# tool workload and each only where set (datasets.evaluation_tool_params)
EVALUATION_TOOLS = evaluation_tool_params(RESULT)
# The engine flags every measurement served the target with: each command the card and serving.json give carries them.
SERVED_FLAGS = serving_methods.served_flags(
    RESULT["server"], TARGET.trust_remote_code, EVALUATION_TOOLS
)


def method_evaluation(wildcards):
    return serving_methods.measurement_settings(
        wildcards.method, RESULT["evaluation"], EVALUATION_TOOLS
    )


# Where the target alone is measured (core/platform.py): once for the grid on GPUs, in each method's own
# window on a shared CPU. The machine the servers run on is operational: it names no param.
SHARED_BASELINE = devices.baseline_once_per_grid(
    "cuda" if config["server"]["gpus"] else "cpu"
)
BASELINE = "results/evaluation/baseline.json"


def measurement_inputs():
    """What every measurement reads: the target, the prompts, the preflight (a method the config cannot
    measure is refused first) and, where it is measured once for the grid, the target alone.
    """
    return {
        "model": target_input(),
        "prompts": evaluation_sources(),
        "preflight": ancient(PREFLIGHT),
        **({"baseline": BASELINE} if SHARED_BASELINE else {}),
    }


def schedule_inputs(wildcards=None):
    """The schedule is the pick's, served with the published drafter."""
    return {
        **measurement_inputs(),
        "results": "results/evaluation/results.json",
        "drafter": "results/drafter/final.safetensors",
        "drafter_config": "results/drafter/config.json",
    }


def evaluation_inputs(wildcards):
    """A method's measurement reads what every measurement reads; a trained family also its export and
    gate (and EAGLE-3 a warm start's pretrained drafter, measured beside it)."""
    inputs = measurement_inputs()
    family = wildcards.method
    if family in FAMILIES:
        inputs.update(
            drafter=f"results/drafters/{family}/final.safetensors",
            drafter_config=f"results/drafters/{family}/config.json",
            gate=f"results/drafters/{family}/gate.json",
        )
        if family == drafter_families.DEFAULT_FAMILY and WARM_START:
            inputs["pretrained"] = pretrained_input()
    return inputs


def evaluation_servers(wildcards):
    return serving_methods.servers(
        wildcards.method, config["evaluation"], WARM_START
    ) - (1 if SHARED_BASELINE else 0)


def measurement_threads():
    """A measurement on a CPU server holds the machine: Snakemake runs nothing beside a job of all its
    cores (a training job beside a measurement read a 1.05x speed-up as 2.17x). On GPUs it computes on
    its own devices, and a cluster job on its own node."""
    threads = config["server"]["threads"]
    if config["server"]["gpus"] or workflow.nodes is not None:
        return threads
    try:
        return max(threads, workflow.cores)
    except WorkflowError:  # no --cores given (a dry run): the count does not matter
        return threads


# One measurement at a time, whatever the executor: a resource Snakemake's scheduler holds to 1 (unless
# the command line sets it).
if "measurement" not in workflow.global_resources:
    workflow.register_resource("measurement", 1)


def manifests(wildcards=None):
    return (
        []
        if ONLINE
        else expand("results/hidden_states/{dataset}/manifest.json", dataset=DATASETS)
    )


def train_gpus():
    """Online mode serves the target beside the trainer."""
    return config["train"]["gpus"] + (config["server"]["gpus"] if ONLINE else 0)


# A GPU job is one process that holds all its GPUs (a server with --tensor-parallel-size 8, torchrun
# starting its own ranks). snakemake-executor-plugin-slurm 2.6.1 asks --ntasks-per-gpu=1 unless told
# otherwise (its issue 459): an 8-GPU job would become eight tasks of one GPU each.
ONE_TASK_PER_JOB = (
    0  # the plugin's tasks_per_gpu resource: 0 leaves --ntasks-per-gpu out
)


def server_runtime(work_minutes, servers=1):
    """A server job's time limit: its work plus, per server it starts, the start-up it may wait for
    (server.startup_timeout_s: a 1T target loads for most of an hour)."""
    return work_minutes + servers * math.ceil(
        config["server"]["startup_timeout_s"] / 60
    )
