import logging
from pathlib import Path

from draftsmith.atomic import write_json
from draftsmith.chat import tokenize_file
from draftsmith.runner import run


def main() -> None:
    cfg = sm.params.tokenize
    stats = tokenize_file(Path(sm.input.responses), sm.params.model, Path(sm.output.table), Path(sm.output.rejects),
                          sm.wildcards.dataset, cfg["max_length"], cfg["reasoning"], cfg["chat_template_kwargs"])
    write_json(sm.output.stats, stats)
    logging.getLogger("draftsmith.tokenize").info("%s", stats)


if __name__ == "__main__":  # dataloader workers re-import this file without `snakemake`
    sm = snakemake  # noqa: F821 - injected by Snakemake
    run(main, sm.log[0], sm.threads)
