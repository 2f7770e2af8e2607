from pathlib import Path

from draftsmith.generation.model_prep import prepare_gguf
from draftsmith.ops.runner import run, target_of

if __name__ == "__main__":
    sm = snakemake
    run(lambda: prepare_gguf(target_of(sm).gguf_file(), Path(sm.output[0])), sm.log[0], sm.threads)
