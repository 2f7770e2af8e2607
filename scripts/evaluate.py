import json
import logging
from pathlib import Path

from draftsmith.core.atomic import write_json
from draftsmith.evaluation.decide.pick import FINETUNED
from draftsmith.evaluation.measure import evaluate as ev
from draftsmith.evaluation.measure import methods
from draftsmith.generation.server import managed_server
from draftsmith.ops.runner import base_dir, run, target_of

log = logging.getLogger("draftsmith.evaluation.measure.evaluate")


def main() -> None:
    method, cfg, server_cfg = sm.wildcards.method, sm.params.evaluation, sm.config["server"]
    tgt = target_of(sm)
    record = {"method": method, "trained": methods.is_trained(method), "target": tgt.model, "engine": cfg["engine"],
              "concurrency": cfg["concurrency"], "temperatures": cfg["temperatures"], "max_tokens": cfg["max_tokens"]}
    gate = json.loads(Path(sm.input.gate).read_text()) if record["trained"] else None
    skip = methods.not_measured(method, sm.resources.gpu > 0, gate)
    if skip:
        log.warning("%s: not measured: %s", method, next(iter(skip.values())))
        write_json(sm.output.results, {**record, **skip, "baseline": [], "cells": [], **ev.machine_record(server_cfg)})
        return
    drafters = {}
    if record["trained"]:
        drafters[FINETUNED] = str(Path(sm.input.drafter).parent)
        if sm.input.get("pretrained"):
            drafters["pretrained"] = str(Path(sm.input.pretrained[0]).parent)
    else:
        drafters[method] = None
    config = json.loads(Path(sm.input.drafter_config).read_text()) if record["trained"] else None
    lengths = methods.draft_lengths(method, cfg, config)
    grid = ev.with_context(ev.grid_of(cfg, sm.config["tokenize"], base_dir(sm)), tgt, server_cfg)
    logs = Path(sm.log.main).parent
    parser = ev.tool_call_parser(grid, sm.config["target"]["tool_call_parser"], server_cfg)

    def server(label: str | None = None, k: int = 0, drafter: str | None = None):
        spec = ev.for_measurement(ev.server_spec(cfg["engine"], tgt, server_cfg, label and method, k, drafter, cfg),
                                  parser)
        return lambda: managed_server(spec, logs / f"{method}.{f'{label}.k{k}' if label else 'baseline'}.server.log")

    shared = json.loads(Path(sm.input.baseline).read_text()) if sm.input.get("baseline") else None
    measured = ev.measure_method(grid, tgt.model, server(), {
        (label, k): server(label, k, drafter) for label, drafter in drafters.items() for k in lengths}, shared)
    write_json(sm.output.results, {**record, **measured, "drafters": drafters, "draft_lengths": lengths,
                                   **ev.machine_record(server_cfg), "seeded_sampling": grid.seeded})


if __name__ == "__main__":
    sm = snakemake
    run(main, sm.log.main, sm.threads, sm.resources.gpu)
