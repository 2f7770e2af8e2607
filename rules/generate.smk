rule generate:
    """Answer one dataset's prompts with the target (managed vLLM/SGLang server or external endpoints)."""
    input:
        model=target_input,
        prompts="results/prompts/{generated}.jsonl",
        preflight=ancient(PREFLIGHT),
    output:
        responses="results/responses/{generated}.jsonl",
        stats="results/responses/{generated}.stats.json",
        errors="results/responses/{generated}.errors.jsonl",
    log:
        main="logs/generate/{generated}.log",
        server="logs/generate/{generated}.server.log",
    benchmark:
        "results/timings/generate/{generated}.tsv"
    threads: config["server"]["threads"]
    resources:
        gpu=generation_gpus(),
        tasks_per_gpu=ONE_TASK_PER_JOB,
        mem_mb=config["server"]["mem_mb"],
        runtime=server_runtime(24 * 60, servers=1 if generation_gpus() else 0),
    params:
        dataset=generation_params,
        model_name=generation_model_name(),
        chat_template_kwargs=RESULT["target"]["chat_template_kwargs"],
        server=RESULT["server"],
    script:
        "../scripts/generate.py"
