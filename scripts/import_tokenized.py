import logging
from pathlib import Path

from draftsmith.config import target
from draftsmith.core.atomic import write_json, write_jsonl
from draftsmith.data.pretokenized import import_tokenized
from draftsmith.ops.runner import base_dir, run, target_of

log = logging.getLogger("draftsmith.import_tokenized")


def main() -> None:
    name = sm.wildcards.pretokenized
    vocab_size = target.facts(target_of(sm)).vocab_size
    stats, rejects = import_tokenized(sm.params.dataset, base_dir(sm), name, vocab_size, sm.params.max_length,
                                      Path(sm.output.table))
    write_jsonl(sm.output.rejects, [r.as_dict() for r in rejects])
    if rejects:
        log.warning("%s: %d rows rejected, first: %s (all in %s)", name, len(rejects), rejects[0], sm.output.rejects)
    write_json(sm.output.stats, stats)
    log.info("%s: %s", name, stats)


if __name__ == "__main__":
    sm = snakemake
    run(main, sm.log[0])
