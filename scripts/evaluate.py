import asyncio
import json
import logging
from pathlib import Path

from draftsmith import bench
from draftsmith.atomic import write_json
from draftsmith.datasets import load_configured
from draftsmith.runner import run
from draftsmith.server import managed_server, spec_from_config

log = logging.getLogger("draftsmith.benchmark")


def training_first_turns() -> set[str]:
    turns = set()
    for path in sm.input.responses:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                first_user = next(m for m in json.loads(line)["messages"] if m["role"] == "user")
                turns.add(bench.normalize(first_user["content"]))
    return turns


def main() -> None:
    cfg, server, model = sm.params.benchmark, sm.params.server, sm.params.model
    drafter = str(Path(sm.input.drafter).parent)
    seen = training_first_turns()
    sets = {}
    for name, entry in cfg["prompt_sets"].items():
        loaded = load_configured(entry, Path(sm.params.base_dir))
        kept, dropped = bench.decontaminate(loaded.prompts, seen)
        if not kept:
            raise ValueError(f"benchmark set {name}: no prompts left after removing {len(dropped)} "
                             "that also appear in the training prompts")
        sets[name] = (kept, dropped)
    sampling = {"max_tokens": cfg["max_tokens"], "temperature": cfg["temperature"]}
    spec_cfg = {"method": "eagle3", "model": drafter, "num_speculative_tokens": cfg["num_speculative_tokens"]}
    results = {name: {"prompts": len(kept), "decontaminated_ids": dropped} for name, (kept, dropped) in sets.items()}
    with managed_server(spec_from_config(model, server), Path(sm.log.baseline)) as url:
        for name, (kept, _) in sets.items():
            results[name]["baseline"] = asyncio.run(bench.run_set(url, model, kept, sampling,
                                                                  cfg["concurrency"])).as_dict()
            log.info("baseline %s: %s", name, results[name]["baseline"])
    with managed_server(spec_from_config(model, server, speculative_config=spec_cfg), Path(sm.log.eagle3)) as url:
        for name, (kept, _) in sets.items():
            before = bench.scrape_spec_counters(bench.root_of(url))
            res = asyncio.run(bench.run_set(url, model, kept, sampling, cfg["concurrency"])).as_dict()
            res["acceptance"] = bench.acceptance(before, bench.scrape_spec_counters(bench.root_of(url)))
            results[name]["eagle3"] = res
            log.info("eagle3 %s: %s", name, res)
    for res in results.values():
        base, eagle = res["baseline"]["output_tok_s"], res["eagle3"]["output_tok_s"]
        res["speedup"] = eagle / base if base and eagle else None
    write_json(sm.output.results, {"target": model, "drafter": drafter, "sets": results, **sampling,
                                   "concurrency": cfg["concurrency"],
                                   "num_speculative_tokens": cfg["num_speculative_tokens"]})


if __name__ == "__main__":  # dataloader workers re-import this file without `snakemake`
    sm = snakemake  # noqa: F821 - injected by Snakemake
    run(main, sm.log.main, sm.threads)
