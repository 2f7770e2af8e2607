import asyncio
import logging
from pathlib import Path

from draftsmith import compute
from draftsmith import evaluate as ev
from draftsmith.atomic import write_json
from draftsmith.datasets import load_configured
from draftsmith.runner import base_dir, run, target_of
from draftsmith.server import managed_server

log = logging.getLogger("draftsmith.evaluate")


def main() -> None:
    cfg, server_cfg = sm.params.evaluation, sm.config["server"]
    concurrency = sm.config["evaluation"]["concurrency"]
    model = target_of(sm).model
    sets = {name: load_configured(entry, base_dir(sm)).prompts for name, entry in cfg["prompt_sets"].items()}
    drafters = {"finetuned": str(Path(sm.input.drafter).parent)}
    if sm.input.pretrained:
        drafters["pretrained"] = str(Path(sm.input.pretrained[0]).parent)
    runs = {(name, t): {"set": name, "temperature": t, "prompts": len(prompts), "drafters": {}}
            for name, prompts in sets.items() for t in cfg["temperatures"]}

    seeded = compute.has_accelerator()

    def sampling(t):
        return ev.sampling(cfg["max_tokens"], t, seeded)

    with managed_server(ev.server_spec(cfg["engine"], model, server_cfg, None, cfg), Path(sm.log.baseline)) as server:
        for (name, t), res in runs.items():
            res["baseline"] = asyncio.run(ev.run_set(server.base_url, model, sets[name], sampling(t),
                                                     concurrency)).as_dict()
            log.info("baseline %s T=%s: %s", name, t, res["baseline"])
    for label, drafter in drafters.items():
        spec = ev.server_spec(cfg["engine"], model, server_cfg, drafter, cfg)
        with managed_server(spec, Path(sm.log.main).with_name(f"{label}.server.log")) as server:
            for (name, t), res in runs.items():
                res["drafters"][label] = ev.measure(server.base_url, model, sets[name], sampling(t), concurrency,
                                                    cfg["engine"])
                log.info("%s %s T=%s: %s", label, name, t, res["drafters"][label])
    for res in runs.values():
        base = res["baseline"]["output_tok_s"]
        for measured in res["drafters"].values():
            measured["speedup"] = measured["output_tok_s"] / base if base and measured["output_tok_s"] else None
    write_json(sm.output.results, {"target": model, "engine": cfg["engine"], "drafters": drafters,
                                   "compute": compute.choose(server_cfg["dtype"]).as_dict(),
                                   "runs": list(runs.values()), "max_tokens": cfg["max_tokens"],
                                   "seeded_sampling": seeded,
                                   "concurrency": concurrency, "num_speculative_tokens": cfg["num_speculative_tokens"]})


if __name__ == "__main__":
    sm = snakemake
    run(main, sm.log.main, sm.threads)
