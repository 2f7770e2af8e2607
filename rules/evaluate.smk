rule benchmark:
    """Held-out prompts through a baseline and an EAGLE-3 vLLM server; τ from /metrics deltas."""
    input:
        model=target_input,
        drafter="results/drafter/final.safetensors",
        drafter_config="results/drafter/config.json",
        responses=expand("results/responses/{dataset}.jsonl", dataset=DATASETS),
    output:
        results="results/benchmark/report.json",
    params:
        benchmark=config["benchmark"],
        server=config["server"],
        model=target_model(),
        base_dir=BASE_DIR,
    log:
        main="logs/benchmark/benchmark.log",
        baseline="logs/benchmark/baseline.server.log",
        eagle3="logs/benchmark/eagle3.server.log",
    benchmark:
        "results/benchmarks/benchmark.tsv"
    threads: config["server"]["threads"]
    resources:
        gpu=config["server"]["gpus"],
        mem_mb=config["server"]["mem_mb"],
        runtime=12 * 60,
    script:
        "../scripts/benchmark.py"


rule report:
    input:
        results="results/benchmark/report.json",
        stats=expand("results/responses/{dataset}.stats.json", dataset=DATASETS),
        training="results/drafter/training.json",
    output:
        markdown="results/benchmark/report.md",
        plot="results/benchmark/acceptance.png",
        training_plot="results/benchmark/training.png",
    log:
        "logs/benchmark/report.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=10,
    script:
        "../scripts/report.py"
