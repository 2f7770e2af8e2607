import json
import logging
from pathlib import Path

import pyarrow.parquet as pq

from draftsmith import vocab
from draftsmith.runner import run


def main() -> None:
    rows = pq.read_metadata(sm.input.table).num_rows
    train_rows = int(rows * (1 - sm.params.validation_fraction))
    target_vocab = json.loads((Path(sm.params.model) / "config.json").read_text())["vocab_size"]
    stats = vocab.build(Path(sm.input.table), train_rows, sm.params.vocab["draft_vocab_size"], target_vocab,
                        Path(sm.output.d2t), Path(sm.output.t2d), Path(sm.output.stats))
    logging.getLogger("draftsmith.vocab").info("%s", stats)


if __name__ == "__main__":  # dataloader workers re-import this file without `snakemake`
    sm = snakemake  # noqa: F821 - injected by Snakemake
    run(main, sm.log[0])
