import json
from pathlib import Path

from draftsmith.config.load import shareable_yaml
from draftsmith.core.atomic import write_json, write_text
from draftsmith.evaluation.render.model_card import CardInputs, card
from draftsmith.ops.runner import run
from draftsmith.ops.stack import versions
from draftsmith.training.export import drafter_size


def load(path):
    return json.loads(Path(path).read_text())


def main() -> None:
    not_exported = Path(sm.input.sglang) / "NOT_EXPORTED.txt"
    results = load(sm.input.results)
    family = results["family"]
    inputs = CardInputs(
        base_model=sm.params.base_model, config_digest=sm.params.config_digest,
        datasets=sm.params.datasets, results=results,
        training=next(t for t in map(load, sm.input.trainings) if t["family"] == family),
        merge=load(sm.input.merge),
        prompts={Path(p).name.removesuffix(".stats.json"): load(p) for p in sm.input.prompts},
        train_config=sm.params.train[family], drafter_config=load(sm.input.drafter_config),
        sglang_reason=not_exported.read_text().strip() if not_exported.exists() else None,
        serving=load(sm.input.serving), gate=load(sm.input.gate), workloads=sm.params.workloads,
        size=drafter_size(Path(sm.input.weights)), served_flags=sm.params.served_flags)
    write_text(Path(sm.output.card), card(inputs))
    write_text(Path(sm.output.config), shareable_yaml(sm.config))
    write_json(sm.output.versions, versions())


if __name__ == "__main__":
    sm = snakemake
    run(main, sm.log[0])
