rule prompts:
    """One dataset's prompts, less those that match an evaluation prompt or an earlier dataset's."""
    input:
        source=dataset_source,
        evaluation=evaluation_sources,
        earlier=earlier_sources,
    output:
        prompts="results/prompts/{generated}.jsonl",
        rejects="results/prompts/{generated}.rejects.jsonl",
        stats="results/prompts/{generated}.stats.json",
    log:
        "logs/prompts/{generated}.log",
    threads: 1
    resources:
        mem_mb=4000,
        runtime=60,
    params:
        prompts_params,
    script:
        "../scripts/prompts.py"
