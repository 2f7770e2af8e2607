"""The published method's schedule (draftsmith.evaluation.decide.schedule; rule evaluate_schedule): written beside the
drafter as one vLLM config, and, where its draft length changes with the batch, served once and measured at
every concurrency of the grid against the target alone."""

import json
import logging
from pathlib import Path

from draftsmith.core.atomic import write_json
from draftsmith.evaluation.decide import schedule
from draftsmith.evaluation.measure import evaluate as ev
from draftsmith.generation.server import managed_server, spec_from_config
from draftsmith.ops.runner import base_dir, run, target_of

log = logging.getLogger("draftsmith.evaluation.decide.schedule")
DRAFTER_HERE = "."  # the config is read from inside the drafter's folder: `cd results/drafter && vllm serve ...`


def main() -> None:
    results = json.loads(Path(sm.input.results).read_text())
    cfg, server_cfg, tgt = sm.params.evaluation, sm.config["server"], target_of(sm)
    plan = results["schedule"]
    # vLLM's schedule from another engine's cells was never measured: none is given (the card says so)
    record = {"schedule": plan, "described": schedule.describe(plan),
              "speculative_config": schedule.speculative_config(plan, DRAFTER_HERE, cfg)
              if cfg["engine"] == "vllm" else None}
    if plan["kind"] != "dynamic" or cfg["engine"] != "vllm":
        why = {"plain": "no band drafts: serve without speculation",
               "fixed": "one draft length at every measured concurrency: the grid's own cells measured it"}
        record["measured"] = {"skipped": why.get(plan["kind"], f"evaluation.engine {cfg['engine']} serves no "
                                                                  "dynamic schedule: its per-band commands stand")}
        log.info("schedule %s: %s", plan["kind"], record["measured"]["skipped"])
        write_json(sm.output.serving, record)
        return
    drafter = str(Path(sm.input.drafter).parent)
    grid = ev.with_context(ev.grid_of(cfg, sm.config["tokenize"], base_dir(sm)), tgt, server_cfg)
    logs = Path(sm.log.main).parent
    parser = ev.tool_call_parser(grid, sm.config["target"]["tool_call_parser"], server_cfg)

    def server(config: dict | None, name: str):
        spec = ev.for_measurement(spec_from_config(tgt, server_cfg, speculative_config=config), parser)
        return lambda: managed_server(spec, logs / f"schedule.{name}.server.log")

    shared = json.loads(Path(sm.input.baseline).read_text()) if sm.input.get("baseline") else None
    served = schedule.speculative_config(plan, drafter, cfg)
    measured = ev.measure_method(grid, tgt.model, server(None, "baseline"),
                                 {("schedule", plan["max_k"]): server(served, "dynamic")}, shared)
    record["measured"] = {**measured, **ev.machine_record(server_cfg)}
    write_json(sm.output.serving, record)


if __name__ == "__main__":
    sm = snakemake
    run(main, sm.log.main, sm.threads, sm.resources.gpu)
