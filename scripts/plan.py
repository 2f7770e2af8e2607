import logging
from pathlib import Path

from draftsmith.config import target as targets
from draftsmith.core.atomic import write_json, write_text
from draftsmith.data.chat import Renderer
from draftsmith.data.datasets import read_prompts
from draftsmith.evaluation.measure.evaluate import prompt_sets
from draftsmith.generation.generate import JOURNAL_DIR
from draftsmith.ops import plan
from draftsmith.ops.runner import base_dir, run, target_of


def main() -> None:
    cfg = sm.config
    tgt = target_of(sm)
    facts = targets.facts_without_weights(tgt)
    renderer = Renderer(targets.load_tokenizer(tgt), cfg["target"]["chat_template_kwargs"])
    results = Path("results")
    plans = []
    for path in map(Path, sm.input.prompts):
        name = path.name.removesuffix(".jsonl")
        prompts = read_prompts(path)
        prompt_tokens, rows_per_sample = plan.row_prompts(renderer, prompts, cfg["plan"]["prompt_sample"],
                                                          cfg["tokenize"]["tool_rendering"],
                                                          cfg["tokenize"]["max_length"])
        plans.append(plan.plan_dataset(name, cfg["datasets"][name], prompts, prompt_tokens,
                                       cfg["plan"]["completion_fraction"], JOURNAL_DIR,
                                       cfg["tokenize"]["max_length"], rows_per_sample))
    throughput = plan.measured_throughput(results, cfg["plan"]["throughput"], cfg["train"]["families"])
    markdown, data = plan.render(plans, facts, cfg, throughput, *plan.free_space(results, cfg["plan"]["free_tb"]))
    sets = {name: (len(prompts), sum(len(p.turns) for p in prompts))
            for name, prompts in prompt_sets(cfg["evaluation"], base_dir(sm)).items()}
    grid = plan.grid_plan(cfg, sets, results, throughput)
    data["grid"] = {**grid.__dict__, "seconds": grid.seconds}
    markdown += "\n".join(plan.grid_section(grid, data["training_s"]) + plan.engine_check_section(cfg, results)
                          + plan.drafters_section(facts, cfg, results)
                          + plan.measured_section(results, plans)) + "\n"
    write_json(sm.output.data, data)
    write_text(sm.output.markdown, markdown)
    logging.getLogger("draftsmith.ops.plan").info("\n%s", markdown)


if __name__ == "__main__":
    sm = snakemake
    run(main, sm.log[0])
