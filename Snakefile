# draftsmith: prompts -> regenerated answers -> tokens -> hidden states -> EAGLE-3 drafter -> evaluation report.
# Heavy libraries (torch, transformers, vllm) are imported only inside jobs, never here.
from snakemake.utils import min_version

min_version("9.0")


report: "report/workflow.rst"


include: "rules/common.smk"


wildcard_constraints:
    dataset="|".join(DATASETS),
    generated="|".join(GENERATED) or "^$",
    pretokenized="|".join(PRETOKENIZED) or "^$",
    family="|".join(FAMILIES),
    method="|".join(METHODS),


include: "rules/model.smk"
include: "rules/prompts.smk"
include: "rules/generate.smk"
include: "rules/tokenize.smk"
include: "rules/hidden_states.smk"
include: "rules/train.smk"
include: "rules/evaluate.smk"
include: "rules/plan.smk"


onstart:
    forward_stops_to_jobs()  # stopping Snakemake stops its running jobs (draftsmith/ops/stop.py)


rule all:
    default_target: True
    input:
        "results/drafter/final.safetensors",
        "results/drafter/README.md",
        "results/report/report.md",
