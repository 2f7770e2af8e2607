"""One finished project's records, as its jobs write them (results.json, serving.json, gate.json, training.json),
for the tests that render the report and the card from the same records. On GPUs: EAGLE-3 drafts 3 tokens at
concurrency 1 and 1 at 12, where none of its cells held; n-gram, which needs no drafter, beat it at both; the
engine ran 10.8 at concurrency 12, so its band starts at batch size 11."""

from __future__ import annotations

import copy

from draftsmith.evaluation.decide import pick, schedule
from draftsmith.evaluation.measure import methods
from draftsmith.training import export
from tests import grid

NGRAM = {"prompt_lookup_min": 2, "prompt_lookup_max": 4}
NOT_HELD = "10.00 requests in flight on average, of 12"


def evaluations() -> dict[str, dict]:
    eagle3 = grid.evaluation("eagle3", {(1, 1): (1.3, 1.5), (3, 1): (1.4, 1.9), (1, 12): (1.2, 1.4),
                                        (3, 12): (1.1, 1.7)})
    ngram = grid.evaluation("ngram", {(1, 1): (1.5, 1.3), (3, 1): (1.45, 1.35), (1, 12): (1.3, 1.2),
                                      (3, 12): (1.25, 1.25)}, trained=False)
    for evaluation in (eagle3, ngram):
        for point in [*evaluation["cells"], *evaluation["baseline"]]:
            for run in point["runs"]:
                run["on_accelerator"] = True
                if point["concurrency"] == 12:
                    run["mean_running"] = 10.8
    for cell in eagle3["cells"]:
        if cell["concurrency"] == 12:
            for run in cell["runs"]:
                run.update(held=False, held_why=NOT_HELD, mean_in_flight=10.0)
    for evaluation in (eagle3, ngram):
        evaluation["on_accelerator"], evaluation["device"] = True, "cuda"
    return {"eagle3": eagle3, "ngram": ngram}


def results() -> dict:
    """results.json as the pick job writes it (its schedule included)."""
    measured = evaluations()
    rows = [pick.summary("eagle3", measured["eagle3"], grid.training(), 3 * 2**20, "speedup", 1)]
    chosen, why = pick.choose(rows, "speedup", 1)
    out = pick.results(measured, rows, chosen, why, [1, 12], "speedup", 1, NGRAM)
    return {**out, "schedule": schedule.build(out["serving"], chosen)}


def serving(results: dict) -> dict:
    """serving.json as scripts/evaluate_schedule.py writes it for a dynamic schedule (its measurement left out)."""
    plan = results["schedule"]
    return {"schedule": plan, "described": schedule.describe(plan),
            "speculative_config": schedule.speculative_config(plan, methods.DRAFTER_HERE, {"engine": "vllm"}),
            "measured": {"skipped": "not measured"}}


GATE = {"passed": True, "epoch": 2, "verdict": "served first-token acceptance 0.610 (predicted 0.640)",
        "acceptance": {"drafts": 120, "acceptance_rate_per_position": [0.61, 0.4, 0.2]},
        "predicted": {"rows": 8, "drafts": 118, "acceptance_rate_per_position": [0.64, 0.42, 0.22],
                      "exactness": {"basis": "estimate", "agreement": 0.97}},
        "thresholds": export.flag_thresholds(),
        "positions": [{"position": i + 1, "predicted": p, "served": s, "ratio": s / p, "flag": False}
                      for i, (p, s) in enumerate(((0.64, 0.61), (0.42, 0.4), (0.22, 0.2)))]}


def finished_before(results: dict, serving: dict, gate: dict) -> tuple[dict, dict, dict]:
    """The same records as a project finished before their newer fields were written: no ``beaten_by``, band
    starts, bands or engine means in the schedule, no ``serve_first``, tool use or derived draft lengths from the pick,
    no ``held_why`` or reading conditions on a run, no epoch or flag thresholds in the gate."""
    results, serving, gate = copy.deepcopy(results), copy.deepcopy(serving), copy.deepcopy(gate)
    for plan in (results["schedule"], serving["schedule"]):
        for key in ("beaten_by", "starts", "starts_from", "running", "bands"):
            plan.pop(key)
    for entry in results["serving"]:
        entry.pop("serve_first")
    for figure in pick.RECORDED:
        results.pop(figure)
    for run in pick.measured_runs(results["methods"]):
        for key in ("held_why", "sample_s", "min_readings"):
            run.pop(key, None)
    gate.pop("epoch")
    gate.pop("thresholds", None)
    return results, serving, gate
