rule import_pretrained:
    """Warm start: the pretrained drafter in speculators' layout, checked against the target."""
    input:
        model=target_input,
        preflight=ancient(PREFLIGHT),
    output:
        check=f"{PRETRAINED}/check.json",
    log:
        "logs/import_pretrained.log",
    threads: 1
    resources:
        mem_mb=8000,
        runtime=60,
    params:
        source=config["train"]["from_pretrained"],
        aux_layers=RESULT["hidden_states"]["aux_layers"],
        sglang=RESULT["export"]["sglang"] is True,
    script:
        "../scripts/import_pretrained.py"


rule vocab:
    """Draft vocabulary (d2t/t2d): built from the training split, or the warm-start drafter's own."""
    input:
        model=target_input,
        table="results/merged/train.parquet",
        pretrained=pretrained_input,
    output:
        d2t="results/vocab/d2t.npy",
        t2d="results/vocab/t2d.npy",
        stats="results/vocab/stats.json",
    log:
        "logs/vocab.log",
    threads: 1
    resources:
        mem_mb=4000,
        runtime=60,
    params:
        vocab=RESULT["vocab"],
        warm_start=WARM_START,
    script:
        "../scripts/vocab.py"


rule engine_check_family:
    """One family's engine check, an input of its training (engine_checked): the preflight's verdict where it
    checked the family before any work, else vLLM started on the target's twin with a random drafter of the
    family, so a family added to a finished run is checked before it trains. A family the engine cannot serve
    fails here. No params and a script left as it is: a rerun of this job for a trained family would, through
    the ancient() edge, keep Snakemake from planning anything downstream in that invocation.
    """
    input:
        preflight=ancient(PREFLIGHT),
    output:
        ENGINE_CHECKED,
    log:
        "logs/engine_check_family/{family}.log",
    priority: 101  # before the check the pick reads, which then reuses its verdict
    threads: config["server"]["threads"]
    resources:
        gpu=config["server"]["gpus"],
        tasks_per_gpu=ONE_TASK_PER_JOB,
        mem_mb=config["server"]["mem_mb"],
        runtime=server_runtime(5, servers=1),
    script:
        "../scripts/engine_check_family.py"


rule train:
    """Train one drafter family with speculators from the shared hidden states and vocabulary
    (checkpoints under results/train_runs/{family}/ resume); pick the epoch with the best simulated τ.
    """
    input:
        model=target_input,
        table="results/merged/train.parquet",
        manifests=manifests,
        d2t="results/vocab/d2t.npy",
        t2d="results/vocab/t2d.npy",
        pretrained=family_pretrained_input,
        engine_check=engine_checked,
    output:
        summary="results/train/{family}/training.json",
    log:
        main="logs/train/{family}.log",
        server="logs/train/{family}.server.log",
    benchmark:
        "results/timings/train_{family}.tsv"
    threads: config["train"]["threads"]
    resources:
        gpu=train_gpus(),
        tasks_per_gpu=ONE_TASK_PER_JOB,
        mem_mb=config["train"]["mem_mb"],
        runtime=server_runtime(48 * 60, servers=1 if ONLINE else 0),
    params:
        train=family_settings,
        hidden_states=RESULT["hidden_states"],
        server=RESULT["server"],
        runs_dir=lambda wildcards: f"results/train_runs/{wildcards.family}",
    script:
        "../scripts/train.py"


rule export:
    """One family's chosen checkpoint for vLLM (and SGLang), gated: vLLM must load it and accept drafts
    (a family the engine cannot serve on this machine is exported and marked so, never gated on a guess).
    """
    input:
        model=target_input,
        summary="results/train/{family}/training.json",
        table="results/merged/train.parquet",
        manifests=manifests,  # the stored hidden states the gate's prediction replays the drafter on
    output:
        weights="results/drafters/{family}/final.safetensors",
        config="results/drafters/{family}/config.json",
        gate="results/drafters/{family}/gate.json",
        sglang=directory("results/drafters/{family}/sglang"),
    log:
        main="logs/export/{family}.log",
        server="logs/export/{family}.server.log",
    threads: config["server"]["threads"]
    resources:
        gpu=config["server"]["gpus"],
        tasks_per_gpu=ONE_TASK_PER_JOB,
        mem_mb=config["server"]["mem_mb"],
        runtime=server_runtime(60),
    params:
        export=RESULT["export"],
        base_model=config["target"]["base_model"],
    script:
        "../scripts/export.py"
