rule evaluate_baseline:
    """The target alone at every point of the grid, once for every method, where the platform measures it
    so (core/platform.py baseline_once_per_grid: dedicated GPUs, measurements one at a time); on a shared CPU
    each method measures it again in its own window."""
    input:
        model=target_input,
        prompts=evaluation_sources(),
        preflight=ancient(PREFLIGHT),
    output:
        results="results/evaluation/baseline.json",
    log:
        main="logs/evaluate/baseline.log",
    benchmark:
        "results/timings/evaluate_baseline.tsv"
    threads: measurement_threads()
    resources:
        gpu=config["server"]["gpus"],
        tasks_per_gpu=ONE_TASK_PER_JOB,
        mem_mb=config["server"]["mem_mb"],
        runtime=server_runtime(12 * 60),
        measurement=1,
    params:
        evaluation=serving_methods.grid_settings(RESULT["evaluation"], EVALUATION_TOOLS),
        server=RESULT["server"],
    script:
        "../scripts/evaluate_baseline.py"


rule evaluate:
    """One serving method (a trained family, or a training-free one: n-gram, suffix decoding) against the
    target alone, measured in one window that holds the machine: every draft length x concurrency x
    prompt set x temperature, τ from /metrics deltas. A family the engine cannot serve here, or whose
    export or gate failed, is recorded as such, with no figure."""
    input:
        unpack(evaluation_inputs),
    output:
        results="results/evaluation/{method}.json",
    log:
        main="logs/evaluate/{method}.log",
    benchmark:
        "results/timings/evaluate_{method}.tsv"
    threads: measurement_threads()
    resources:
        gpu=config["server"]["gpus"],
        tasks_per_gpu=ONE_TASK_PER_JOB,
        mem_mb=config["server"]["mem_mb"],
        runtime=lambda wildcards: server_runtime(
            12 * 60, servers=evaluation_servers(wildcards)
        ),
        measurement=1,  # one measurement at a time (common.smk registers it)
    params:
        evaluation=method_evaluation,
        server=RESULT["server"],
    script:
        "../scripts/evaluate.py"


rule pick:
    """Per concurrency the best serving setting (method, draft tokens) of all measured; the trained family
    that wins at evaluation.pick_at becomes results/drafter/ (a family left out says why). results.json
    holds every method's cells side by side."""
    input:
        evaluations=expand("results/evaluation/{method}.json", method=METHODS),
        trainings=expand("results/train/{family}/training.json", family=FAMILIES),
        drafters=expand("results/drafters/{family}/final.safetensors", family=FAMILIES),
        configs=expand("results/drafters/{family}/config.json", family=FAMILIES),
        gates=expand("results/drafters/{family}/gate.json", family=FAMILIES),
        sglang=expand("results/drafters/{family}/sglang", family=FAMILIES),
        engine_check=ENGINE_CHECK,
    output:
        weights="results/drafter/final.safetensors",
        config="results/drafter/config.json",
        gate="results/drafter/gate.json",
        sglang=directory("results/drafter/sglang"),
        results="results/evaluation/results.json",
    log:
        "logs/pick.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        families=FAMILIES,
        pick_by=RESULT["evaluation"]["pick_by"],
        pick_at=PICK_AT,
        concurrency=RESULT["evaluation"]["concurrency"],
        ngram=RESULT["evaluation"]["ngram"],
    script:
        "../scripts/pick.py"


rule evaluate_schedule:
    """The published method's schedule (a draft length per batch-size band, none where plain serving wins)
    as one vLLM config beside the drafter; where its draft length changes with the batch, served once and
    measured at every concurrency of the grid against the target alone."""
    input:
        unpack(schedule_inputs),
    output:
        serving="results/drafter/serving.json",
    log:
        main="logs/evaluate/schedule.log",
    benchmark:
        "results/timings/evaluate_schedule.tsv"
    threads: measurement_threads()
    resources:
        gpu=config["server"]["gpus"],
        tasks_per_gpu=ONE_TASK_PER_JOB,
        mem_mb=config["server"]["mem_mb"],
        runtime=server_runtime(12 * 60, servers=1 if SHARED_BASELINE else 2),
        measurement=1,
    params:
        evaluation=serving_methods.grid_settings(RESULT["evaluation"], EVALUATION_TOOLS),
        server=RESULT["server"],
    script:
        "../scripts/evaluate_schedule.py"


rule training_free:
    """Training-free speculation alone (no hidden states, no training): per concurrency the best
    training-free setting against the target alone. `./run.sh results/evaluation/training_free.md`
    tells in minutes whether a drafter is worth days."""
    input:
        evaluations=expand("results/evaluation/{method}.json", method=TRAINING_FREE),
    output:
        markdown="results/evaluation/training_free.md",
    log:
        "logs/training_free.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=10,
    params:
        pick_by=RESULT["evaluation"]["pick_by"],
        concurrency=RESULT["evaluation"]["concurrency"],
    script:
        "../scripts/training_free.py"


rule report:
    """The report: the serving recipe and speed-up map, evaluation, training curves, generation and data
    statistics, with plots."""
    input:
        results="results/evaluation/results.json",
        generation=expand("results/responses/{dataset}.stats.json", dataset=GENERATED),
        prompts=expand("results/prompts/{dataset}.stats.json", dataset=GENERATED),
        tokenized=expand("results/tokenized/{dataset}.stats.json", dataset=GENERATED),
        merge="results/merged/stats.json",
        vocab="results/vocab/stats.json",
        trainings=expand("results/train/{family}/training.json", family=FAMILIES),
        gate="results/drafter/gate.json",
        gates=expand("results/drafters/{family}/gate.json", family=FAMILIES),
        serving="results/drafter/serving.json",
    output:
        markdown="results/report/report.md",
        plot=report(
            "results/report/acceptance.png",
            caption="../report/acceptance.rst",
            category="Evaluation",
        ),
        speedup_map=report(
            "results/report/speedup_map.png",
            caption="../report/speedup_map.rst",
            category="Evaluation",
        ),
        table=report(
            "results/report/evaluation.tsv",
            caption="../report/evaluation.rst",
            category="Evaluation",
        ),
        training_plot=report(
            "results/report/training.png",
            caption="../report/training.rst",
            category="Training",
        ),
        families_plot=report(
            "results/report/families.png",
            caption="../report/families.rst",
            category="Evaluation",
        ),
    log:
        "logs/report.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=10,
    params:
        workloads=WORKLOADS,
    script:
        "../scripts/report.py"


rule model_card:
    """results/drafter/README.md: the hub's model card, every figure from this run's files; beside it what
    reproducing the drafter needs: the effective config (secret values redacted) and the versions of vLLM,
    speculators, torch and transformers."""
    input:
        results="results/evaluation/results.json",
        trainings=expand("results/train/{family}/training.json", family=FAMILIES),
        merge="results/merged/stats.json",
        prompts=expand("results/prompts/{dataset}.stats.json", dataset=GENERATED),
        sglang="results/drafter/sglang",
        drafter_config="results/drafter/config.json",
        weights="results/drafter/final.safetensors",
        serving="results/drafter/serving.json",
        gate="results/drafter/gate.json",
    output:
        card=report(
            "results/drafter/README.md",
            caption="../report/model_card.rst",
            category="Drafter",
        ),
        config="results/drafter/draftsmith.yaml",
        versions="results/drafter/versions.json",
    log:
        "logs/model_card.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=10,
    params:
        base_model=BASE_MODEL,
        config_digest=CONFIG_DIGEST,
        train={family: family_settings(family=family) for family in FAMILIES},
        datasets=DATASET_ENTRIES,
        workloads=WORKLOADS,
        served_flags=SERVED_FLAGS,
    script:
        "../scripts/model_card.py"
