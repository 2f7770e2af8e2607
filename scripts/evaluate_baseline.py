"""The target alone, measured once for the whole serving grid where the platform says so
(draftsmith.core.platform.baseline_once_per_grid: dedicated GPUs, measurements one at a time); every method's
speed-ups divide by it."""

from pathlib import Path

from draftsmith.core.atomic import write_json
from draftsmith.evaluation.measure import evaluate as ev
from draftsmith.generation.server import managed_server
from draftsmith.ops.runner import base_dir, run, target_of


def main() -> None:
    cfg, server_cfg, tgt = sm.params.evaluation, sm.config["server"], target_of(sm)
    grid = ev.with_context(ev.grid_of(cfg, sm.config["tokenize"], base_dir(sm)), tgt, server_cfg)
    parser = ev.tool_call_parser(grid, sm.config["target"]["tool_call_parser"], server_cfg)
    spec = ev.for_measurement(ev.server_spec(cfg["engine"], tgt, server_cfg), parser)
    log = Path(sm.log.main).with_suffix(".server.log")
    measured = ev.measure_baseline(grid, tgt.model, lambda: managed_server(spec, log))
    write_json(sm.output.results, {**measured, "target": tgt.model, "engine": cfg["engine"],
                                   **ev.machine_record(server_cfg)})


if __name__ == "__main__":
    sm = snakemake
    run(main, sm.log.main, sm.threads, sm.resources.gpu)
