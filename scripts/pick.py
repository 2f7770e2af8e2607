import json
import logging
from pathlib import Path

from draftsmith.core.atomic import write_json
from draftsmith.evaluation import pick
from draftsmith.ops.runner import run

log = logging.getLogger("draftsmith.evaluation.pick")


def load(path):
    return json.loads(Path(path).read_text())


def main() -> None:
    families, pick_by = sm.params.families, sm.params.pick_by
    evaluations = dict(zip(families, map(load, sm.input.evaluations), strict=True))
    rows = [pick.summary(family, evaluations[family], load(training), Path(weights).stat().st_size, pick_by)
            for family, training, weights in zip(families, sm.input.trainings, sm.input.drafters, strict=True)]
    chosen, why = pick.choose(rows, pick_by)
    log.info("picked %s by %s: %s", chosen, pick_by, why)
    at = families.index(chosen)
    for source, dest in ((sm.input.drafters[at], sm.output.weights), (sm.input.configs[at], sm.output.config),
                         (sm.input.gates[at], sm.output.gate), (sm.input.sglang[at], sm.output.sglang)):
        pick.copy_drafter(Path(source), Path(dest))
    write_json(sm.output.results, {**evaluations[chosen], "family": chosen,
                                   "pick": {"by": pick_by, "family": chosen, "why": why}, "families": rows})


if __name__ == "__main__":
    sm = snakemake
    run(main, sm.log[0])
