from pathlib import Path

from draftsmith.model_prep import prepare_target
from draftsmith.runner import run


if __name__ == "__main__":  # dataloader workers re-import this file without `snakemake`
    sm = snakemake  # noqa: F821 - injected by Snakemake
    run(lambda: prepare_target(sm.params.target["source"], Path(sm.output[0])), sm.log[0], sm.threads)
