import asyncio
import logging
from contextlib import nullcontext
from pathlib import Path

from draftsmith.atomic import write_jsonl
from draftsmith.datasets import load_configured, resolve_source
from draftsmith.generate import GenerationSettings, Outputs, generate, has_work, make_client, settings_key
from draftsmith.runner import run
from draftsmith.server import generation_spec, managed_server

log = logging.getLogger("draftsmith.generate")


def main() -> None:
    ds, name = sm.params.dataset, sm.wildcards.dataset
    prompts = load_configured(ds, Path(sm.params.base_dir))
    write_jsonl(sm.output.rejects, [r.as_dict() for r in prompts.rejects])
    if prompts.rejects:
        log.warning("%s: %d rows rejected, first: %s (all in %s)", name, len(prompts.rejects), prompts.rejects[0],
                    sm.output.rejects)
    settings = GenerationSettings.from_config(ds["generation"])
    gen = sm.params.generation_server
    managed = gen["mode"] == "managed"
    model = sm.params.model if managed else (gen["served_model"] or sm.params.model)
    source = resolve_source(ds["source"], Path(sm.params.base_dir))
    journal = Path(sm.params.journal_dir) / f"{name}-{settings_key(model, source, settings)}.jsonl"
    outputs = Outputs(Path(sm.output.responses), Path(sm.output.stats), Path(sm.output.errors), journal)
    if not has_work(prompts.prompts, journal, ds["max_samples"], ds["token_budget"]):
        log.info("%s: everything is already journaled or the budget is reached; no server needed", name)
        stats = asyncio.run(_generate(prompts.prompts, None, settings, outputs, ds, name, len(prompts.rejects)))
    else:
        context = managed_server(generation_spec(model, sm.params.server, gen), Path(sm.log.server)) if managed \
            else nullcontext(gen["base_urls"])
        with context as base_urls:
            client = make_client(base_urls, model, settings, gen["api_key_env"], gen["headers"])
            stats = asyncio.run(_generate(prompts.prompts, client, settings, outputs, ds, name,
                                          len(prompts.rejects)))
    log.info("%s: %s", name, stats)


async def _generate(prompts, client, settings, outputs, ds, name, rejects):
    try:
        return await generate(prompts, client, settings, outputs, max_samples=ds["max_samples"],
                              token_budget=ds["token_budget"], dataset=name, rejects=rejects)
    finally:
        if client is not None:
            await client.aclose()


if __name__ == "__main__":  # dataloader workers re-import this file without `snakemake`
    sm = snakemake  # noqa: F821 - injected by Snakemake
    run(main, sm.log.main)
