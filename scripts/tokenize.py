import logging
from pathlib import Path

from draftsmith.config.target import load_tokenizer
from draftsmith.core.atomic import write_json
from draftsmith.data.chat import TokenizeSettings, tokenize_file
from draftsmith.ops.runner import run, target_of


def main() -> None:
    settings = TokenizeSettings.from_config(sm.config["tokenize"])
    stats = tokenize_file(Path(sm.input.responses), load_tokenizer(target_of(sm)), Path(sm.output.table),
                          Path(sm.output.rejects), sm.wildcards.generated, settings, sm.params.chat_template_kwargs)
    write_json(sm.output.stats, stats)
    logging.getLogger("draftsmith.tokenize").info("%s", stats)


if __name__ == "__main__":
    sm = snakemake
    run(main, sm.log[0], sm.threads)
