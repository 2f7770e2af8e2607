rule hidden_states:
    """Offline mode: target hidden states for one dataset's rows, in a fingerprinted store that
    survives reruns (only missing or stale rows are extracted)."""
    input:
        model=target_input,
        table="results/tokenized/{dataset}.parquet",
        pretrained=pretrained_input,
        preflight=ancient(PREFLIGHT),
    output:
        manifest="results/hidden_states/{dataset}/manifest.json",
    log:
        main="logs/hidden_states/{dataset}.log",
        server="logs/hidden_states/{dataset}.server.log",
    benchmark:
        "results/timings/hidden_states/{dataset}.tsv"
    threads: config["server"]["threads"]
    resources:
        gpu=config["server"]["gpus"],
        tasks_per_gpu=ONE_TASK_PER_JOB,
        mem_mb=config["server"]["mem_mb"],
        runtime=server_runtime(24 * 60),
    params:
        hidden_states=RESULT["hidden_states"],
        server=RESULT["server"],
    script:
        "../scripts/hidden_states.py"
