import json
import logging
from pathlib import Path

from draftsmith.core import platform
from draftsmith.core.atomic import write_json
from draftsmith.evaluation.decide import pick, schedule
from draftsmith.ops.runner import run

log = logging.getLogger("draftsmith.evaluation.decide.pick")


def load(path):
    return json.loads(Path(path).read_text())


def main() -> None:
    families, params = sm.params.families, sm.params
    evaluations = {Path(p).stem: load(p) for p in sm.input.evaluations}
    figure = platform.ranking_figure(params.pick_by, pick.measured_on(evaluations))
    if figure != params.pick_by:
        log.warning("ranked by %s, not evaluation.pick_by %s: measured on a CPU, where speed-ups do not carry "
                    "over to GPUs", pick.FIGURES[figure], pick.FIGURES[params.pick_by])
    rows = [pick.summary(family, evaluations[family], load(training), Path(weights).stat().st_size, figure,
                         params.pick_at)
            for family, training, weights in zip(families, sm.input.trainings, sm.input.drafters, strict=True)]
    chosen, why = pick.choose(rows, figure, params.pick_at)
    log.info("picked %s by %s at concurrency %d: %s", chosen, figure, params.pick_at, why)
    for row in rows:
        if not row["served"]:
            log.warning("%s left out of the pick (%s): %s", row["family"], row["excluded"], row["reason"])
    at = families.index(chosen)
    for source, dest in ((sm.input.drafters[at], sm.output.weights), (sm.input.configs[at], sm.output.config),
                         (sm.input.gates[at], sm.output.gate), (sm.input.sglang[at], sm.output.sglang)):
        pick.copy_drafter(Path(source), Path(dest))
    results = pick.results(evaluations, rows, chosen, why, params.concurrency, figure, params.pick_at,
                           params.ngram)
    results["pick"]["asked"] = params.pick_by
    results["schedule"] = schedule.build(results["serving"], chosen)
    log.info("%s's schedule (%s): %s", chosen, results["schedule"]["kind"], schedule.describe(results["schedule"]))
    for entry in results["serving"]:
        best = entry["best"]
        for cell in entry["not_held"]:
            log.warning("at concurrency %d %s k=%d did not hold (%s): ranked at what it delivered%s",
                        entry["concurrency"], cell["method"], cell["k"], cell["why"],
                        "; no method held there" if entry["nothing_held"] else "")
        if entry["plain_wins"]:
            log.warning("at concurrency %d plain serving (no speculation) is best by %s", entry["concurrency"],
                        pick.FIGURES[figure])
        elif entry["training_free_wins"]:
            log.warning("at concurrency %d the training-free %s (k=%d) beats every trained drafter",
                        entry["concurrency"], best["method"], best["k"])
    for change in results["load_changed"]:
        log.warning("the target alone read %s tok/s at concurrency %d (%s, T=%g) in different windows: the "
                    "machine's load changed", change["baseline_tok_s"], change["concurrency"], change["set"],
                    change["temperature"])
    write_json(sm.output.results, results)


if __name__ == "__main__":
    sm = snakemake
    run(main, sm.log[0])
