import logging
from pathlib import Path

from draftsmith.config import target
from draftsmith.data import vocab
from draftsmith.ops.runner import run, target_of


def main() -> None:
    outputs = (Path(sm.output.d2t), Path(sm.output.t2d), Path(sm.output.stats))
    if sm.params.warm_start:
        stats = vocab.copy_pretrained(Path(sm.input.pretrained[0]).parent, Path(sm.input.table), *outputs)
    else:
        stats = vocab.build(Path(sm.input.table), sm.params.vocab["draft_vocab_size"],
                            target.facts(target_of(sm)).vocab_size, *outputs)
    logging.getLogger("draftsmith.data.vocab").info("%s", stats)


if __name__ == "__main__":
    sm = snakemake
    run(main, sm.log[0])
