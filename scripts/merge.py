from pathlib import Path

from draftsmith.core.atomic import write_json
from draftsmith.data.merge import merge
from draftsmith.ops.runner import run


def main() -> None:
    tables = {Path(p).name.removesuffix(".parquet"): Path(p) for p in sm.input.tables}
    cfg = sm.params.merge
    write_json(sm.output.stats, merge(tables, Path(sm.output.table), cfg["seed"], cfg["validation_fraction"],
                                      sm.params.weights))


if __name__ == "__main__":
    sm = snakemake
    run(main, sm.log[0])
