from pathlib import Path

from draftsmith.core import compute
from draftsmith.core.atomic import write_json
from draftsmith.evaluation import evaluate as ev
from draftsmith.generation.server import managed_server
from draftsmith.ops.runner import base_dir, run, target_of


def main() -> None:
    cfg, server_cfg = sm.params.evaluation, sm.config["server"]
    concurrency = sm.config["evaluation"]["concurrency"]
    tgt = target_of(sm)
    sets = ev.prompt_sets(cfg, base_dir(sm))
    seeded = compute.has_accelerator()
    spec = ev.server_spec(cfg["engine"], tgt, server_cfg)
    with managed_server(spec, Path(sm.log.server)) as server:
        runs = ev.baseline_runs(server.base_url, tgt.model, sets, cfg["temperatures"], cfg["max_tokens"], seeded,
                                concurrency)
    write_json(sm.output.baseline, {"target": tgt.model, "engine": cfg["engine"], "runs": runs,
                                    "max_tokens": cfg["max_tokens"], "seeded_sampling": seeded,
                                    "concurrency": concurrency,
                                    "compute": compute.choose(server_cfg["dtype"]).as_dict()})


if __name__ == "__main__":
    sm = snakemake
    run(main, sm.log.main, sm.threads, sm.resources.gpu)
