import json
from pathlib import Path

from draftsmith.core import platform
from draftsmith.core.atomic import write_text
from draftsmith.evaluation.decide import pick
from draftsmith.evaluation.render.report import training_free_markdown
from draftsmith.ops.runner import run


def main() -> None:
    evaluations = {Path(p).stem: json.loads(Path(p).read_text()) for p in sm.input.evaluations}
    if not evaluations:
        raise pick.NothingToPick("evaluation.training_free is empty (or its methods are not measured with "
                                 "evaluation.engine sglang): there is no training-free method to measure; list "
                                 "ngram or suffix there")
    figure = platform.ranking_figure(sm.params.pick_by, pick.measured_on(evaluations))
    serving = pick.serving(evaluations, sm.params.concurrency, figure)
    pick.require_measured(evaluations, serving, figure)
    write_text(Path(sm.output.markdown), training_free_markdown(evaluations, serving, figure))


if __name__ == "__main__":
    sm = snakemake
    run(main, sm.log[0])
