import asyncio
import logging
from contextlib import nullcontext
from functools import partial
from pathlib import Path

from draftsmith.config.target import load_tokenizer
from draftsmith.data.chat import Renderer, TokenizeSettings, ToolTemplateError, early_check, tool_template_problem
from draftsmith.data.datasets import read_prompts
from draftsmith.generation.client import HealthPolicy
from draftsmith.generation.generate import (
    JOURNAL_DIR,
    ContextLimit,
    GenerationSettings,
    Outputs,
    context_tokens,
    generate,
    has_work,
    journal_path,
    make_client,
    model_context,
    settings_key,
    tool_options,
)
from draftsmith.generation.server import generation_spec, managed_server
from draftsmith.ops.runner import run, target_of

log = logging.getLogger("draftsmith.generation.generate")


def main() -> None:
    name, params = sm.wildcards.generated, sm.params
    entry = sm.config["datasets"][name]  # operational settings too (concurrency, timeouts): not in params
    gen = sm.config["generation_server"]
    managed = gen["mode"] == "managed"
    token_ids = gen["return_token_ids"]
    prompts = read_prompts(Path(sm.input.prompts))
    tokenize = TokenizeSettings.from_config(sm.config["tokenize"])
    # rows with tools: the target's parser where a managed server reads the calls, or the tools as text
    tools = tool_options(prompts, sm.config["target"]["tool_call_parser"], tokenize.tool_rendering,
                         gen["engine"] if managed else None, name, tokenize.reasoning)
    settings = GenerationSettings.from_config(
        entry["generation"], chat_template_kwargs=params.chat_template_kwargs,
        return_token_ids=(managed and gen["engine"] == "vllm") if token_ids == "auto" else token_ids, **tools)
    journal = journal_path(JOURNAL_DIR, name, settings_key(params.model_name, settings))
    outputs = Outputs(Path(sm.output.responses), Path(sm.output.stats), Path(sm.output.errors), journal)
    limits = {"max_samples": entry["max_samples"], "token_budget": entry["token_budget"]}
    if not has_work(prompts, journal, **limits):
        log.info("%s: everything is already journaled or the budget is reached; no server needed", name)
        asyncio.run(_generate(prompts, None, settings, outputs, limits, name, None, None, None))
        return
    target = target_of(sm)
    tokenizer = load_tokenizer(target)
    if any(p.tools for p in prompts):  # a template that drops tools is refused before the server starts
        problem = tool_template_problem(tokenizer, params.chat_template_kwargs, tokenize.tool_rendering)
        if problem:
            raise ToolTemplateError(f"datasets.{name}: {problem}")
    early = partial(early_check, tokenizer, settings=tokenize, template_kwargs=params.chat_template_kwargs, where=name)
    context = context_limit(target, sm.config["server"]["max_model_len"] if managed else None,
                            Renderer(tokenizer, params.chat_template_kwargs), tokenize.tool_rendering, prompts,
                            tokenize.max_length)
    served = target.model if managed else (gen["served_model"] or target.model)
    serving = managed_server(generation_spec(target, sm.config["server"], gen, settings.tool_call_parser),
                             Path(sm.log.server)) \
        if managed else nullcontext(None)
    with serving as server:
        health = HealthPolicy(outage_grace_s=gen["outage_grace_s"])
        client = make_client(server.base_url if server else external_urls(gen), served, settings, gen["api_key_env"],
                             gen["headers"], health=health, max_retry_after_s=gen["max_retry_after_s"])
        stats = asyncio.run(_generate(prompts, client, settings, outputs, limits, name,
                                      server.exit_message if server else None, early, context))
    log.info("%s: %s", name, stats)


def external_urls(gen: dict) -> list[str]:
    """The configured URLs and those published by server jobs (one per file matching url_files)."""
    urls = list(gen["base_urls"])
    for pattern in gen["url_files"]:
        for path in sorted(Path().glob(pattern)):
            urls += [line.strip() for line in path.read_text().splitlines() if line.strip()]
    if not urls:
        raise ValueError(f"generation_server: no endpoint: base_urls is empty and no file matching {gen['url_files']} "
                         "holds a URL (is a `python -m draftsmith.generation.serve` job running?)")
    return urls


def context_limit(target, max_model_len: int | None, renderer: Renderer, tool_rendering: str, prompts,
                  max_length: int) -> ContextLimit | None:
    """The context a request must fit: the managed server's max_model_len, else the target's own (an external
    endpoint's shorter limit is its own: a refusal there stays an error), and the row's where the request is one
    (:func:`context_tokens`). None when none is known."""
    tokens = context_tokens(max_model_len, model_context(target), prompts, max_length)
    return ContextLimit(tokens, renderer, tool_rendering) if tokens else None


async def _generate(prompts, client, settings, outputs, limits, name, server_exit, early, context):
    try:
        return await generate(prompts, client, settings, outputs, dataset=name, server_exit=server_exit,
                              early_check=early, context=context, **limits)
    finally:
        if client is not None:
            await client.aclose()


if __name__ == "__main__":
    sm = snakemake
    run(main, sm.log.main, gpus=sm.resources.gpu)
