import json
import logging
from pathlib import Path

from draftsmith.core import compute
from draftsmith.core.atomic import write_json
from draftsmith.evaluation import evaluate as ev
from draftsmith.generation.server import managed_server
from draftsmith.ops.runner import base_dir, run, target_of
from draftsmith.training import families

log = logging.getLogger("draftsmith.evaluation.evaluate")


def main() -> None:
    family, cfg, server_cfg = sm.wildcards.family, sm.params.evaluation, sm.config["server"]
    concurrency = sm.config["evaluation"]["concurrency"]
    tgt = target_of(sm)
    chain = cfg.get("num_speculative_tokens")  # EAGLE-3's; a block family drafts its trained block
    unserved = families.not_served_here(family, on_gpus=sm.resources.gpu > 0)
    if unserved:
        log.warning("%s: %s", family, unserved)
        write_json(sm.output.results, {"target": tgt.model, "family": family, "not_served": unserved, "runs": []})
        return
    sets = ev.prompt_sets(cfg, base_dir(sm))
    drafters = {"finetuned": str(Path(sm.input.drafter).parent)}
    if sm.input.pretrained:
        drafters["pretrained"] = str(Path(sm.input.pretrained[0]).parent)
    baseline = json.loads(Path(sm.input.baseline).read_text())
    runs = ev.runs_from_baseline(baseline, sm.input.baseline, sets, cfg["temperatures"], cfg["max_tokens"])
    seeded = compute.has_accelerator()
    for label, drafter in drafters.items():
        spec = ev.server_spec(cfg["engine"], tgt, server_cfg, drafter, chain)
        with managed_server(spec, Path(sm.log.main).with_name(f"{family}.{label}.server.log")) as server:
            for (name, t), res in runs.items():
                res["drafters"][label] = ev.measure(server.base_url, tgt.model, sets[name],
                                                    ev.sampling(cfg["max_tokens"], t, seeded), concurrency,
                                                    cfg["engine"])
                log.info("%s %s T=%s: %s", label, name, t, res["drafters"][label])
    ev.add_speedups(list(runs.values()))
    write_json(sm.output.results, {"target": tgt.model, "family": family, "engine": cfg["engine"],
                                   "drafters": drafters, "compute": compute.choose(server_cfg["dtype"]).as_dict(),
                                   "runs": list(runs.values()), "max_tokens": cfg["max_tokens"],
                                   "seeded_sampling": seeded, "on_accelerator": compute.has_accelerator(),
                                   "concurrency": concurrency,
                                   "num_speculative_tokens": ev.drafted_per_step(drafters["finetuned"], chain)[1]})


if __name__ == "__main__":
    sm = snakemake
    run(main, sm.log.main, sm.threads, sm.resources.gpu)
