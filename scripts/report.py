import json
from pathlib import Path

from draftsmith.report import write_report
from draftsmith.runner import run


def main() -> None:
    results = json.loads(Path(sm.input.results).read_text())
    stats = {Path(p).name.removesuffix(".stats.json"): json.loads(Path(p).read_text()) for p in sm.input.stats}
    training = json.loads(Path(sm.input.training).read_text())
    write_report(results, stats, training, Path(sm.output.markdown), Path(sm.output.plot),
                 Path(sm.output.training_plot))


if __name__ == "__main__":  # dataloader workers re-import this file without `snakemake`
    sm = snakemake  # noqa: F821 - injected by Snakemake
    run(main, sm.log[0])
