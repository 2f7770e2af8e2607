rule train:
    """Train the EAGLE-3 drafter with speculators; checkpoints under results/train_runs/ resume."""
    input:
        model=target_input,
        table="results/merged/train.parquet",
        manifests=expand("results/hidden_states/{dataset}/manifest.json", dataset=DATASETS),
        d2t="results/vocab/d2t.npy",
        t2d="results/vocab/t2d.npy",
    output:
        weights="results/drafter/final.safetensors",
        config="results/drafter/config.json",
        summary="results/drafter/training.json",
    params:
        train=config["train"],
        validation_fraction=config["merge"]["validation_fraction"],
        model=target_model(),
        runs_dir="results/train_runs",
    log:
        "logs/train.log",
    benchmark:
        "results/benchmarks/train.tsv"
    threads: config["train"]["threads"]
    resources:
        gpu=config["train"]["gpus"],
        mem_mb=16000,
        runtime=48 * 60,
    script:
        "../scripts/train.py"
