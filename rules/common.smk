import os
import sys

sys.path.insert(0, workflow.basedir)  # the draftsmith package, when not pip-installed

from draftsmith.config import ConfigError, validate_config

try:
    _validated = validate_config(config)
except ConfigError as err:
    raise WorkflowError(str(err)) from None
config.clear()
config.update(_validated)

DATASETS = sorted(config["datasets"])
BASE_DIR = workflow.basedir


wildcard_constraints:
    dataset="|".join(DATASETS),


def target_model():
    """Where the target's HF folder is: converted under results/ for GGUF, else the source itself."""
    source = config["target"]["source"]
    if source.startswith("package:") or source.endswith(".gguf"):
        return f"results/models/{config['target']['name']}"
    return source


def target_input(wildcards=None):
    model = target_model()
    return [model] if model.startswith("results/") or os.path.exists(model) else []


def dataset_cfg(wildcards):
    return config["datasets"][wildcards.dataset]


def local_source(entry):
    """The prompt file as a job input when it is a plain local path (so edits rerun the dataset)."""
    source = entry["source"]
    if source.startswith(("package:", "hf:")):
        return []
    return [source if os.path.isabs(source) else os.path.join(BASE_DIR, source)]


def dataset_source(wildcards):
    return local_source(dataset_cfg(wildcards))


def generation_gpus():
    return config["server"]["gpus"] if config["generation_server"]["mode"] == "managed" else 0
