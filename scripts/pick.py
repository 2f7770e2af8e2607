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
    families, params = sm.params.families, sm.params
    evaluations = {Path(p).stem: load(p) for p in sm.input.evaluations}
    rows = [pick.summary(family, evaluations[family], load(training), Path(weights).stat().st_size, params.pick_by,
                         params.pick_at)
            for family, training, weights in zip(families, sm.input.trainings, sm.input.drafters, strict=True)]
    chosen, why = pick.choose(rows, params.pick_by, params.pick_at)
    log.info("picked %s by %s at concurrency %d: %s", chosen, params.pick_by, params.pick_at, why)
    for row in rows:
        if not row["served"]:
            log.warning("%s left out of the pick (%s): %s", row["family"], row["excluded"], row["reason"])
    at = families.index(chosen)
    for source, dest in ((sm.input.drafters[at], sm.output.weights), (sm.input.configs[at], sm.output.config),
                         (sm.input.gates[at], sm.output.gate), (sm.input.sglang[at], sm.output.sglang)):
        pick.copy_drafter(Path(source), Path(dest))
    results = pick.results(evaluations, rows, chosen, why, params.concurrency, params.pick_by, params.pick_at,
                           params.ngram)
    for entry in results["serving"]:
        if entry["training_free_wins"]:
            log.warning("at concurrency %d the training-free %s (k=%d) beats every trained drafter",
                        entry["concurrency"], entry["best"]["method"], entry["best"]["k"])
    write_json(sm.output.results, results)


if __name__ == "__main__":
    sm = snakemake
    run(main, sm.log[0])
