rule hidden_states:
    """Target hidden states for one dataset's rows (files beside the manifest survive reruns)."""
    input:
        model=target_input,
        table="results/tokenized/{dataset}.parquet",
    output:
        manifest="results/hidden_states/{dataset}/manifest.json",
    params:
        hidden_states=config["hidden_states"],
        server=config["server"],
        model=target_model(),
    log:
        main="logs/hidden_states/{dataset}.log",
        server="logs/hidden_states/{dataset}.server.log",
    benchmark:
        "results/benchmarks/hidden_states/{dataset}.tsv"
    threads: config["server"]["threads"]
    resources:
        gpu=config["server"]["gpus"],
        mem_mb=config["server"]["mem_mb"],
        runtime=24 * 60,
    script:
        "../scripts/hidden_states.py"
