import logging
from pathlib import Path

from draftsmith.core.atomic import write_json, write_jsonl
from draftsmith.data import decontaminate as dc
from draftsmith.data.datasets import load_configured, workload_problem, write_prompts
from draftsmith.ops.runner import base_dir, run

log = logging.getLogger("draftsmith.prompts")


def main() -> None:
    p, name, root = sm.params[0], sm.wildcards.generated, base_dir(sm)
    cfg = sm.config["datasets"][name]
    loaded = load_configured(cfg, root, apply_max_samples=False)
    problem = workload_problem(loaded.prompts, cfg["workload"], f"datasets.{name}")
    if problem:
        raise ValueError(problem)
    write_jsonl(sm.output.rejects, [r.as_dict() for r in loaded.rejects])
    if loaded.rejects:
        log.warning("%s: %d rows rejected, first: %s (all in %s)", name, len(loaded.rejects), loaded.rejects[0],
                    sm.output.rejects)
    decon = p["decontamination"]
    index = None
    if decon["enabled"]:
        index = dc.EvaluationIndex.build({n: load_configured(e, root).prompts for n, e in p["evaluation"].items()},
                                         decon["ngram"])
    earlier = {dc.prompt_key(q): f"{d}/{q.id}" for d in p["earlier"]
               for q in load_configured(sm.config["datasets"][d], root, apply_max_samples=False).prompts}
    selection = dc.select(loaded.prompts, index, decon["max_overlap"], earlier)
    write_prompts(selection.kept, Path(sm.output.prompts))
    stats = {"dataset": name, "rows_read": len(loaded.prompts) + len(loaded.rejects),
             "rejected_rows": len(loaded.rejects), **selection.stats()}
    write_json(sm.output.stats, stats)
    log.info("%s: %s", name, stats)


if __name__ == "__main__":
    sm = snakemake
    run(main, sm.log[0])
