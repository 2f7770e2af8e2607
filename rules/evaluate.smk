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
    """Held-out prompts through an EAGLE-3 vLLM server per drafter; τ from /metrics deltas."""
    input:
        model=target_input,
        drafter="results/drafter/final.safetensors",
        drafter_config="results/drafter/config.json",
        gate="results/drafter/gate.json",
        baseline="results/evaluation/baseline.json",
        prompts=evaluation_sources,
        pretrained=pretrained_input,
    output:
        results="results/evaluation/results.json",
    log:
        main="logs/evaluate/evaluate.log",
        finetuned="logs/evaluate/finetuned.server.log",
    benchmark:
        "results/timings/evaluate.tsv"
    threads: config["server"]["threads"]
    resources:
        gpu=config["server"]["gpus"],
        tasks_per_gpu=ONE_TASK_PER_JOB,
        mem_mb=config["server"]["mem_mb"],
        runtime=server_runtime(12 * 60, servers=2 if WARM_START else 1),  # one per drafter
    params:
        evaluation=RESULT["evaluation"],
        server=RESULT["server"],
    script:
        "../scripts/evaluate.py"


rule report:
    """The report: evaluation, training curves, generation and data statistics, with plots."""
    input:
        results="results/evaluation/results.json",
        generation=expand("results/responses/{dataset}.stats.json", dataset=GENERATED),
        prompts=expand("results/prompts/{dataset}.stats.json", dataset=GENERATED),
        merge="results/merged/stats.json",
        vocab="results/vocab/stats.json",
        training="results/train/training.json",
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
        training="results/train/training.json",
        merge="results/merged/stats.json",
        prompts=expand("results/prompts/{dataset}.stats.json", dataset=GENERATED),
        sglang="results/drafter/sglang",
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
        train=RESULT["train"],
        datasets=RESULT["datasets"],
    script:
        "../scripts/model_card.py"
