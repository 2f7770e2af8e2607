rule plan:
    """Tokens, bytes, time and cost per dataset and stage, and the evaluation grid's, before running
    (no server, no weights)."""
    input:
        prompts=expand("results/prompts/{dataset}.jsonl", dataset=GENERATED),
        evaluation=evaluation_sources,
    output:
        markdown=report(
            "results/plan.md", caption="../report/plan.rst", category="Plan"
        ),
        data="results/plan.json",
    log:
        "logs/plan.log",
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        config=RESULT,
        gpus={"server": config["server"]["gpus"], "train": config["train"]["gpus"]},
    script:
        "../scripts/plan.py"
