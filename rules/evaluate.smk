rule evaluate_baseline:
    """The held-out prompts through the target alone: measured once, whatever drafter follows."""
    input:
        model=target_input,
        prompts=evaluation_sources,
    output:
        baseline="results/evaluation/baseline.json",
    log:
        main="logs/evaluate/baseline.log",
        server="logs/evaluate/baseline.server.log",
    benchmark:
        "results/timings/evaluate_baseline.tsv"
    threads: config["server"]["threads"]
    resources:
        gpu=config["server"]["gpus"],
        tasks_per_gpu=ONE_TASK_PER_JOB,
        mem_mb=config["server"]["mem_mb"],
        runtime=server_runtime(12 * 60),
    params:
        evaluation=BASELINE_EVALUATION,
        server=RESULT["server"],
    script:
        "../scripts/evaluate_baseline.py"


rule evaluate:
    """Held-out prompts through a vLLM server per drafter of one family; τ from /metrics deltas (a family the
    engine cannot serve on this machine is recorded as such, with no figure)."""
    input:
        model=target_input,
        drafter="results/drafters/{family}/final.safetensors",
        drafter_config="results/drafters/{family}/config.json",
        gate="results/drafters/{family}/gate.json",
        baseline="results/evaluation/baseline.json",
        prompts=evaluation_sources,
        pretrained=family_pretrained_input,
    output:
        results="results/evaluation/{family}.json",
    log:
        main="logs/evaluate/{family}.log",
    benchmark:
        "results/timings/evaluate_{family}.tsv"
    threads: config["server"]["threads"]
    resources:
        gpu=config["server"]["gpus"],
        tasks_per_gpu=ONE_TASK_PER_JOB,
        mem_mb=config["server"]["mem_mb"],
        runtime=server_runtime(12 * 60, servers=2 if WARM_START else 1),  # one per drafter
    params:
        evaluation=family_evaluation,
        server=RESULT["server"],
    script:
        "../scripts/evaluate.py"


rule pick:
    """The family with the best measured speed-up (or τ: evaluation.pick_by) becomes results/drafter/;
    results.json is its evaluation with every family side by side."""
    input:
        evaluations=expand("results/evaluation/{family}.json", family=FAMILIES),
        trainings=expand("results/train/{family}/training.json", family=FAMILIES),
        drafters=expand("results/drafters/{family}/final.safetensors", family=FAMILIES),
        configs=expand("results/drafters/{family}/config.json", family=FAMILIES),
        gates=expand("results/drafters/{family}/gate.json", family=FAMILIES),
        sglang=expand("results/drafters/{family}/sglang", family=FAMILIES),
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
        pick_by=config["evaluation"]["pick_by"],
    script:
        "../scripts/pick.py"


rule report:
    """The report: evaluation, training curves, generation and data statistics, with plots."""
    input:
        results="results/evaluation/results.json",
        generation=expand("results/responses/{dataset}.stats.json", dataset=GENERATED),
        prompts=expand("results/prompts/{dataset}.stats.json", dataset=GENERATED),
        merge="results/merged/stats.json",
        vocab="results/vocab/stats.json",
        trainings=expand("results/train/{family}/training.json", family=FAMILIES),
        gate="results/drafter/gate.json",
    output:
        markdown="results/report/report.md",
        plot=report(
            "results/report/acceptance.png",
            caption="../report/acceptance.rst",
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
    script:
        "../scripts/report.py"


rule model_card:
    """results/drafter/README.md: the hub's model card, every figure from this run's files."""
    input:
        results="results/evaluation/results.json",
        trainings=expand("results/train/{family}/training.json", family=FAMILIES),
        merge="results/merged/stats.json",
        prompts=expand("results/prompts/{dataset}.stats.json", dataset=GENERATED),
        sglang="results/drafter/sglang",
        drafter_config="results/drafter/config.json",
    output:
        card=report(
            "results/drafter/README.md",
            caption="../report/model_card.rst",
            category="Drafter",
        ),
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
        datasets=RESULT["datasets"],
    script:
        "../scripts/model_card.py"
