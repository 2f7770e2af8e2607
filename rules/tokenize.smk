rule tokenize:
    """Chat template + assistant-only loss mask for one dataset."""
    input:
        model=target_input,
        responses="results/responses/{dataset}.jsonl",
    output:
        table="results/tokenized/{dataset}.parquet",
        rejects="results/tokenized/{dataset}.rejects.jsonl",
        stats="results/tokenized/{dataset}.stats.json",
    params:
        tokenize=config["tokenize"],
        model=target_model(),
    log:
        "logs/tokenize/{dataset}.log",
    threads: 1
    resources:
        mem_mb=4000,
        runtime=60,
    script:
        "../scripts/tokenize.py"


rule merge:
    """All datasets in one seeded shuffle; the last validation_fraction of rows validates."""
    input:
        tables=expand("results/tokenized/{dataset}.parquet", dataset=DATASETS),
    output:
        table="results/merged/train.parquet",
        stats="results/merged/stats.json",
    params:
        merge=config["merge"],
        datasets=DATASETS,
    log:
        "logs/merge.log",
    threads: 1
    resources:
        mem_mb=4000,
        runtime=60,
    script:
        "../scripts/merge.py"


rule vocab:
    """Draft vocabulary (d2t/t2d) from supervised-token frequencies of the training split."""
    input:
        model=target_input,
        table="results/merged/train.parquet",
    output:
        d2t="results/vocab/d2t.npy",
        t2d="results/vocab/t2d.npy",
        stats="results/vocab/stats.json",
    params:
        vocab=config["vocab"],
        validation_fraction=config["merge"]["validation_fraction"],
        model=target_model(),
    log:
        "logs/vocab.log",
    threads: 1
    resources:
        mem_mb=4000,
        runtime=60,
    script:
        "../scripts/vocab.py"
