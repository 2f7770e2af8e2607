import logging
from pathlib import Path

from draftsmith.config import target
from draftsmith.ops.runner import base_dir, run, target_of
from draftsmith.training.pretrained import import_pretrained


def main() -> None:
    tgt = target_of(sm)
    check = import_pretrained(sm.params.source, base_dir(sm), tgt.model, target.facts(tgt), sm.params.aux_layers,
                              Path(sm.output.check).parent, require_sglang=sm.params.sglang)
    logging.getLogger("draftsmith.import_pretrained").info("%s", check)


if __name__ == "__main__":
    sm = snakemake
    run(main, sm.log[0])
