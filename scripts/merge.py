from pathlib import Path

from draftsmith.atomic import write_json
from draftsmith.merge import merge
from draftsmith.runner import run


def main() -> None:
    tables = dict(zip(sm.params.datasets, map(Path, sm.input.tables), strict=True))
    write_json(sm.output.stats, merge(tables, Path(sm.output.table), sm.params.merge["seed"]))


if __name__ == "__main__":  # dataloader workers re-import this file without `snakemake`
    sm = snakemake  # noqa: F821 - injected by Snakemake
    run(main, sm.log[0])
