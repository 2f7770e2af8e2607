rule evaluate:
    """Held-out prompts through a baseline and an EAGLE-3 vLLM server; τ from /metrics deltas."""
    input:
        model=target_input,
        drafter="results/drafter/final.safetensors",
        drafter_config="results/drafter/config.json",
        gate="results/drafter/gate.json",
        prompts=evaluation_sources,
        pretrained=pretrained_input,
    output:
        results="results/evaluation/results.json",
    log:
        main="logs/evaluate/evaluate.log",
        baseline="logs/evaluate/baseline.server.log",
        finetuned="logs/evaluate/finetuned.server.log",
    benchmark:
        "results/timings/evaluate.tsv"
    threads: config["server"]["threads"]
    resources:
        gpu=config["server"]["gpus"],
        mem_mb=config["server"]["mem_mb"],
        runtime=12 * 60,
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
        plot="results/report/acceptance.png",
        training_plot="results/report/training.png",
    log:
        "logs/report.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=10,
    script:
        "../scripts/report.py"
