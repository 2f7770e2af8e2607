import json
from pathlib import Path

from draftsmith.core.atomic import write_text
from draftsmith.evaluation import pick
from draftsmith.evaluation.report import training_free_markdown
from draftsmith.ops.runner import run


def main() -> None:
    evaluations = {Path(p).stem: json.loads(Path(p).read_text()) for p in sm.input.evaluations}
    serving = pick.serving(evaluations, sm.params.concurrency, sm.params.pick_by)
    pick.require_measured(evaluations, serving, sm.params.pick_by)
    write_text(Path(sm.output.markdown), training_free_markdown(evaluations, serving, sm.params.pick_by))


if __name__ == "__main__":
    sm = snakemake
    run(main, sm.log[0])
