"""Agent sets in their published shapes (issue 58), measured on CPU against a scripted endpoint (no vLLM).

Part 1, reading: each shape's fixture (tests/fixtures/agent_shapes/, written from the published schemas) loaded
under ``format: auto``, under its own format and, where it matters, with the set's tools (``datasets.<name>.tools``):
rows read, kept, refused by reason.

Part 2, a trajectory set regenerated on its own history: ``--trajectories`` SWE-agent trajectories in the published
shape (seeded: 3 to 24 actions, observations of 2 to 60 lines) answered turn by turn by the scripted endpoint
(tests/sim/reasoning_server.py, the demo target's tokenizer and template counting the prompts) under the demo's
context (server.max_model_len, tokenize.max_length), then tokenized as the tokenize stage does: turns, rows, tokens,
trajectories cut at the context, and prompt tokens per supervised token against the chat demo's set (everyday,
answered by the same endpoint). Last, the line results/plan.md writes for the trajectory set.

Part 3, OpenHands on a template that renders calls: the OpenHands fixture with the set's tools, and the export with
function calling (nebius/SWE-rebench-openhands-trajectories' shape) with its own, answered turn by turn by the
scripted tool endpoint (tests/sim/tool_server.py, which calls a tool in every answer) through Qwen3's template (the
test asset), tokenized: the requests' shape, rows, and what the rows supervise.

    .venv/bin/python benchmarks/agent_shapes.py --trajectories 40
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import random
import sys
import tempfile
from collections import Counter
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import pyarrow.parquet as pq  # noqa: E402

from draftsmith.config import target as targets  # noqa: E402
from draftsmith.config.load import from_snakemake_args  # noqa: E402
from draftsmith.data.chat import Renderer, TokenizeSettings, tokenize_file  # noqa: E402
from draftsmith.data.datasets import load_prompts  # noqa: E402
from draftsmith.generation.generate import (  # noqa: E402
    ContextLimit,
    GenerationSettings,
    Outputs,
    context_tokens,
    generate,
    make_client,
)
from draftsmith.ops import plan  # noqa: E402
from tests.sim.reasoning_server import ReasoningSim, SimSettings  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures" / "agent_shapes"
# shape -> the readings measured: (label, format, the set's tools)
SHAPES = {"glaive": [("auto", "auto", None)],
          "hermes": [("auto", "auto", None), ("format: hermes", "hermes", None)],
          "xlam": [("auto", "auto", None)],
          "sweagent": [("auto", "auto", None)],
          "openhands": [("auto", "auto", None), ("format: openhands", "openhands", None),
                        ("format: openhands + set tools", "openhands", "openhands")],
          "openhands_trajectory": [("auto", "auto", None), ("format: openhands", "openhands", None)],
          "sharegpt_calls": [("auto", "auto", None), ("auto + set tools", "auto", "sharegpt_calls")]}


def set_tools(shape: str | None) -> list[dict] | None:
    """The tools a set would give (``datasets.<name>.tools``): OpenHands' from the export that carries them, the
    ShareGPT fixture's functions from the Glaive fixture's system text."""
    if shape == "openhands":
        return json.loads(json.loads((FIXTURES / "openhands.jsonl").read_text().splitlines()[1])["tools"])
    if shape == "sharegpt_calls":
        return [{"name": "get_exchange_rate", "description": "Get the exchange rate", "parameters": {
            "type": "object", "properties": {"base_currency": {"type": "string"}, "target_currency": {
                "type": "string"}}, "required": ["base_currency", "target_currency"]}}]
    return None


def reading() -> None:
    print("| shape | read as | rows | kept | refused (field: reason) |\n|---|---|---:|---:|---|")
    for shape, readings in SHAPES.items():
        for label, fmt, tools in readings:
            loaded = load_prompts(FIXTURES / f"{shape}.jsonl", fmt=fmt, tools=set_tools(tools), id_field="id")
            reasons = Counter(f"{r.field}: {r.reason.split(':')[0][:70]}" for r in loaded.rejects)
            refused = "; ".join(f"{n} × {reason}" for reason, n in reasons.items()) or "–"
            print(f"| {shape} | {label} | {len(loaded.prompts) + len(loaded.rejects)} | {len(loaded.prompts)} | "
                  f"{refused} |")


def swe_trajectories(n: int, seed: int = 58) -> list[dict]:
    """SWE-agent trajectories in nebius/SWE-agent-trajectories' shape (``trajectory`` of system / user / ai turns
    with ``text``), of seeded lengths."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        turns = [{"role": "system", "text": "SETTING: You are an autonomous programmer, and you're working directly "
                                            "in the command line with a special interface."},
                 {"role": "user", "text": f"ISSUE:\nseparability_matrix is wrong for nested models ({i})\n"
                                          "(Open file: n/a)\n(Current directory: /repo)\nbash-$"}]
        for k in range(rng.randint(3, 24)):
            action = f"Let me look at step {k}.\n```\nsearch_dir \"separable\" src/{k}\n```"
            turns.append({"role": "ai", "text": action})
            lines = [f"/repo/src/module_{k}_{j}.py:{rng.randint(1, 900)}: def separable_{j}(model):"
                     for j in range(rng.randint(2, 60))]
            turns.append({"role": "user", "text": "\n".join(lines) + "\n(Open file: n/a)\n(Current directory: /repo)"
                                                                      "\nbash-$"})
        rows.append({"instance_id": f"repo__issue-{i}", "trajectory": turns})
    return rows


def answered(prompts, tokenizer, folder: Path, settings: GenerationSettings, context: ContextLimit | None,
             max_length: int) -> tuple[dict, list[dict]]:
    """The set answered by the scripted endpoint, then tokenized: the generate stats and the rows."""
    outputs = Outputs(folder / "r.jsonl", folder / "s.json", folder / "e.jsonl", folder / "j.jsonl")
    sim = SimSettings(tokenizer=tokenizer, think=False, content_log_mean=math.log(60), log_sigma=0.6)
    with ReasoningSim(sim) as server:
        client = make_client(server.base_url, "sim", settings, None, None)

        async def go():
            try:
                return await generate(prompts, client, settings, outputs, max_samples=None, token_budget=None,
                                      dataset="d", context=context)
            finally:
                await client.aclose()

        stats = asyncio.run(go())
    # the rows are our template's rendering; the scripted endpoint counts a prompt without the template's default
    # system prompt (SmolLM2's), which the round trip would call a mismatch
    tokenize_file(outputs.responses, tokenizer, folder / "t.parquet", folder / "rejects.jsonl", "d",
                  TokenizeSettings(max_length=max_length, max_prompt_mismatch_fraction=1.0))
    return stats, pq.read_table(folder / "t.parquet").to_pylist()


def per_supervised(rows: list[dict]) -> tuple[int, int, float]:
    supervised = sum(sum(r["loss_mask"]) for r in rows)
    total = sum(len(r["input_ids"]) for r in rows)
    return total, supervised, (total - supervised) / supervised


def regeneration(n: int) -> None:
    config = from_snakemake_args([], REPO)
    target = targets.resolve(config["target"], REPO)
    tokenizer = targets.load_tokenizer(target)
    renderer = Renderer(tokenizer, config["target"]["chat_template_kwargs"])
    max_length, max_model_len = config["tokenize"]["max_length"], config["server"]["max_model_len"]
    settings = GenerationSettings(max_tokens=128, temperature=0.0, concurrency=8, return_token_ids=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        source = tmp / "swe.jsonl"
        source.write_text("".join(json.dumps(r) + "\n" for r in swe_trajectories(n)))
        trajectories = load_prompts(source, id_field="instance_id").prompts
        turns = sum(len(p.turns) for p in trajectories)
        print(f"\ntrajectory set: {len(trajectories)} trajectories, {turns} observations (turns)\n")
        print("| context (tokens) | records = rows | ended at the context | tokens sent (prompt) | completion | "
              "row tokens | supervised | prompt tokens per supervised token |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        ratio, said = 0.0, []
        for length in (max_length, 8 * max_length):
            context = ContextLimit(context_tokens(max(max_model_len, length), None, trajectories, length), renderer)
            folder = tmp / f"traj-{length}"
            folder.mkdir()
            stats, rows = answered(trajectories, tokenizer, folder, settings, context, length)
            total, supervised, ratio = per_supervised(rows)
            print(f"| {context.tokens:,} | {len(rows)} | {stats['trajectories_ended_at_context']} of "
                  f"{stats['trajectories']} | {stats['prompt_tokens']:,} | {stats['completion_tokens']:,} | "
                  f"{total:,} | {supervised:,} | {ratio:.1f} |")
            said.append(f"tokenize.max_length {length}: " + plan_line(config, target, renderer, trajectories, length,
                                                                        tmp))
        chat = load_prompts(REPO / config["datasets"]["everyday"]["source"]).prompts
        (tmp / "chat").mkdir()
        _, chat_rows = answered(chat, tokenizer, tmp / "chat", settings, ContextLimit(max_model_len, renderer),
                                max_length)
        total, supervised, chat_ratio = per_supervised(chat_rows)
        print(f"\nchat demo set (everyday, {len(chat)} prompts): rows {len(chat_rows)}, {total:,} tokens, "
              f"{supervised:,} supervised: {chat_ratio:.1f} prompt tokens per supervised token "
              f"(trajectory rows at the larger context: {ratio / chat_ratio:.1f}x)")
        print("\nresults/plan.md says (answers at its prior, completion_fraction x max_tokens):")
        print("\n".join(said))
        chat_plan = plan.row_prompts(renderer, chat, config["plan"]["prompt_sample"])[0]
        answer = config["plan"]["completion_fraction"] * config["datasets"]["everyday"]["generation"]["max_tokens"]
        print(f"the plan's chat row (everyday): ~{chat_plan:.0f} prompt tokens, {chat_plan / answer:.1f} prompt tokens "
              "per supervised token at the same prior (the plan writes no such line for a chat set)")


def plan_line(config: dict, target, renderer: Renderer, trajectories: list, max_length: int, tmp: Path) -> str:
    """The line results/plan.md writes for the trajectory set at this ``tokenize.max_length``."""
    prompt_tokens, rows_per_sample = plan.row_prompts(renderer, trajectories, config["plan"]["prompt_sample"],
                                                      max_length=max_length)
    entry = {**config["datasets"]["everyday"], "max_samples": None, "token_budget": None}
    planned = plan.plan_dataset("swe", entry, trajectories, prompt_tokens, config["plan"]["completion_fraction"],
                                tmp / "no-journal", max_length, rows_per_sample)
    markdown, _ = plan.render([planned], targets.facts_without_weights(target), config,
                              plan.measured_throughput(tmp, {}), 1e13, "x")
    return next(line for line in markdown.splitlines() if "supervised token" in line)


def openhands_on_qwen3(fixture: str, tools: list[dict] | None) -> None:
    """An OpenHands fixture (``tools``: the set's) regenerated through Qwen3's template, which renders calls."""
    from transformers import AutoTokenizer

    from tests.sim.tool_server import ToolSim
    from tests.tiny_targets import QWEN3_TOKENIZER

    tokenizer = AutoTokenizer.from_pretrained(QWEN3_TOKENIZER)
    prompts = load_prompts(FIXTURES / f"{fixture}.jsonl", fmt="openhands", tools=tools).prompts
    # the endpoint's script in the task itself (the in-context example around it is not sent)
    prompts = [replace(p, turns=[p.turns[0].replace("<uploaded_files>", "calls=execute_bash <uploaded_files>"),
                                 *p.turns[1:]]) for p in prompts]
    settings = GenerationSettings(max_tokens=128, concurrency=4, return_token_ids=True)
    with tempfile.TemporaryDirectory() as tmp, ToolSim(tokenizer=tokenizer) as server:
        folder = Path(tmp)
        outputs = Outputs(folder / "r.jsonl", folder / "s.json", folder / "e.jsonl", folder / "j.jsonl")
        client = make_client(server.base_url, "sim", settings, None, None)

        async def go():
            try:
                return await generate(prompts, client, settings, outputs, max_samples=None, token_budget=None,
                                      dataset="d")
            finally:
                await client.aclose()

        stats = asyncio.run(go())
        tokenized = tokenize_file(outputs.responses, tokenizer, folder / "t.parquet", folder / "rejects.jsonl", "d",
                                  TokenizeSettings(max_length=8192))
        rows = pq.read_table(folder / "t.parquet").to_pylist()
        supervised = [tokenizer.decode([t for t, m in zip(r["input_ids"], r["loss_mask"], strict=True) if m])
                      for r in rows]
        sent = Counter(m["role"] for body in server.requests for m in body["messages"])
        print(f"\n{fixture} fixture on Qwen3's template: {len(prompts)} trajectories, {stats['records']} records, "
              f"{tokenized['rows']} rows, prompt round trip mismatches {tokenized['round_trip']['prompt_mismatched']}; "
              f"messages sent {dict(sent)}, every request with {len(server.requests[0]['tools'])} tools; rows whose "
              f"supervised tokens are one call of the model's: {sum(s.count('<tool_call>') == 1 for s in supervised)}, "
              f"holding the export's markup (<function=) or a result: "
              f"{sum('<function=' in s or 'EXECUTION RESULT' in s for s in supervised)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trajectories", type=int, default=40)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    reading()
    regeneration(args.trajectories)
    openhands_on_qwen3("openhands", set_tools("openhands"))
    openhands_on_qwen3("openhands_trajectory", None)


if __name__ == "__main__":
    main()
