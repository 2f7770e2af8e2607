import json
from pathlib import Path

from draftsmith.evaluation.render.report import Inputs, write_report
from draftsmith.ops.runner import run


def load(path):
    return json.loads(Path(path).read_text())


def by_dataset(paths):
    return {Path(p).name.removesuffix(".stats.json"): load(p) for p in paths}


def main() -> None:
    results = load(sm.input.results)
    picked = next(t for t in map(load, sm.input.trainings) if t["family"] == results["family"])
    inputs = Inputs(results=results, generation=by_dataset(sm.input.generation),
                    prompts=by_dataset(sm.input.prompts), merge=load(sm.input.merge), vocab=load(sm.input.vocab),
                    training=picked, gate=load(sm.input.gate), serving=load(sm.input.serving),
                    tokenized=by_dataset(sm.input.tokenized),
                    gates={Path(p).parent.name: load(p) for p in sm.input.gates}, workloads=sm.params.workloads)
    write_report(inputs, Path(sm.output.markdown), Path(sm.output.plot), Path(sm.output.training_plot),
                 Path(sm.output.families_plot), Path(sm.output.speedup_map), Path(sm.output.table))


if __name__ == "__main__":
    sm = snakemake
    run(main, sm.log[0])
