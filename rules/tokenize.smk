rule tokenize:
    """Chat template + assistant-only loss mask for one generated dataset, checked against the server."""
    input:
        model=target_input,
        responses="results/responses/{generated}.jsonl",
    output:
        table="results/tokenized/{generated}.parquet",
        rejects="results/tokenized/{generated}.rejects.jsonl",
        stats="results/tokenized/{generated}.stats.json",
    log:
        "logs/tokenize/{generated}.log",
    threads: 1
    resources:
        mem_mb=4000,
        runtime=60,
    params:
        tokenize=tokenize_job_params,
        chat_template_kwargs=RESULT["target"]["chat_template_kwargs"],
    script:
        "../scripts/tokenize.py"


rule import_tokenized:
    """A dataset that is already tokenized (input_ids + loss_mask), validated against the target."""
    input:
        model=target_input,
        source=dataset_source,
        preflight=ancient(PREFLIGHT),
    output:
        table="results/tokenized/{pretokenized}.parquet",
        rejects="results/tokenized/{pretokenized}.rejects.jsonl",
        stats="results/tokenized/{pretokenized}.stats.json",
    log:
        "logs/tokenize/{pretokenized}.log",
    threads: 1
    resources:
        mem_mb=4000,
        runtime=60,
    params:
        dataset=pretokenized_params,
        max_length=RESULT["tokenize"]["max_length"],
    script:
        "../scripts/import_tokenized.py"


rule merge:
    """All datasets in one seeded shuffle, weighted; the split by prompt is made here, once."""
    input:
        tables=expand("results/tokenized/{dataset}.parquet", dataset=DATASETS),
    output:
        table="results/merged/train.parquet",
        stats="results/merged/stats.json",
    log:
        "logs/merge.log",
    threads: 1
    resources:
        mem_mb=4000,
        runtime=60,
    params:
        merge=RESULT["merge"],
        weights={d: RESULT["datasets"][d]["weight"] for d in DATASETS},
    script:
        "../scripts/merge.py"
