rule generate:
    """Answer one dataset's prompts with the target (managed vLLM/SGLang server or external endpoints)."""
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
        generation_server=config["generation_server"],
        model=target_model(),
        base_dir=BASE_DIR,
        journal_dir="results/responses/.journal",
    log:
        main="logs/generate/{dataset}.log",
        server="logs/generate/{dataset}.server.log",
    benchmark:
        "results/benchmarks/generate/{dataset}.tsv"
    threads: config["server"]["threads"]
    resources:
        gpu=generation_gpus(),
        mem_mb=config["server"]["mem_mb"],
        runtime=24 * 60,
    script:
        "../scripts/generate.py"
