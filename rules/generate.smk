rule generate:
    """Answer one dataset's prompts with the target (managed vLLM server or external endpoint)."""
    input:
        model=target_input,
        prompts=dataset_source,
    output:
        responses="results/responses/{dataset}.jsonl",
        stats="results/responses/{dataset}.stats.json",
        errors="results/responses/{dataset}.errors.jsonl",
        rejects="results/responses/{dataset}.rejects.jsonl",
    params:
        dataset=dataset_cfg,
        server=config["server"],
        model=target_model(),
        base_dir=BASE_DIR,
        journal_dir="results/responses/.journal",
    log:
        main="logs/generate/{dataset}.log",
        server="logs/generate/{dataset}.server.log",
    benchmark:
        "benchmarks/generate/{dataset}.tsv"
    threads: config["server"]["threads"]
    resources:
        gpu=server_gpus(),
        mem_mb=config["server"]["mem_mb"],
        runtime=24 * 60,
    script:
        "../scripts/generate.py"
