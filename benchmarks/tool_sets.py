"""Tool-call traffic measured beside chat: a finished run's drafter, n-gram and suffix speculation against the
target alone on BFCL prompt sets (their tools sent on every request), and what regenerating a tool dataset costs
per row against a chat row.

Part 1, the serving figures: one vLLM server per method (the target alone, the run's drafter, ngram, suffix), each
set measured as the grid measures it (``run_set``: the concurrency held, the engine's tokens, tools on every request
and the target's calls answered with the set's results, BFCL multi-turn's run on each row's own instances). Prints
per set and method the output tok/s, the speed-up over the target alone, tokens per target step, τ, and the tool
calls the target made in the window.

Part 2, the cost of a row: the target alone regenerates ``--rows`` rows of each set as ``generate`` does (tool results
paired by name and arguments, BFCL multi-turn calls run live, cuts by reason, ends at a call) and prints per set:
prompt and completion tokens per row, seconds per row, tool calls, cuts and ends at a call.

A target whose chat template ignores tools (SmolLM2, the demo's) gets them as text (``tokenize.tool_rendering: text``),
as a run with that setting would; every other target through its template, with ``--tool-call-parser``.

    .venv/bin/python benchmarks/tool_sets.py WORKDIR --config tests/e2e/config.yaml --rows 16 \\
        --sets bfcl:simple_python bfcl:multiple bfcl:parallel bfcl:multi_turn_base --max-samples 24
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from draftsmith.config.load import EMBEDDED, WORKFLOW_DIR, load_layers, validate_config  # noqa: E402
from draftsmith.config.target import load_tokenizer, resolve  # noqa: E402
from draftsmith.data.chat import tool_template_problem  # noqa: E402
from draftsmith.data.datasets import load_configured  # noqa: E402
from draftsmith.evaluation.measure import evaluate as ev  # noqa: E402
from draftsmith.generation import generate as gen  # noqa: E402
from draftsmith.generation.client import ChatClient, RequestFailed, RetryPolicy  # noqa: E402
from draftsmith.generation.server import managed_server  # noqa: E402


def prompt_sets(config: dict, sources: list[str], max_samples: int) -> dict:
    """The config's own evaluation sets (chat, code) and the given tool sets, ``max_samples`` prompts each."""
    entry = next(iter(config["evaluation"]["prompt_sets"].values()))
    sets = {name: load_configured({**e, "max_samples": max_samples}, REPO).prompts
            for name, e in config["evaluation"]["prompt_sets"].items()}
    for source in sources:
        sets[source.removeprefix("bfcl:")] = load_configured({**entry, "source": source, "skip": 0,
                                                              "max_samples": max_samples}, REPO).prompts
    return sets


def serving(run: Path, config: dict, sets: dict, rendering: str, parser: str | None, k: int, concurrency: int,
            max_tokens: int) -> list[dict]:
    target = resolve(config["target"], REPO)
    family, k = ev.drafted_per_step(str(run / "results" / "drafter"), k)
    methods = {"target alone": (None, None), family: (family, str(run / "results" / "drafter")),
               "ngram": ("ngram", None), "suffix": ("suffix", None)}
    rows = []
    for label, (method, drafter) in methods.items():
        spec = ev.for_measurement(ev.server_spec("vllm", target, config["server"], method, k if method else 0,
                                                 drafter, config["evaluation"]), parser)
        with managed_server(spec, run / "logs" / f"tool_sets.{label.replace(' ', '_')}.server.log") as server:
            ev.warm_up(server.base_url, target.model, sets, max_tokens)
            for name, prompts in sets.items():
                try:
                    measured = ev.measure(server.base_url, target.model, prompts,
                                          ev.sampling(max_tokens, 0.0, False), concurrency, "vllm",
                                          drafting=method is not None, tool_rendering=rendering)
                except RequestFailed as err:  # e.g. a set whose tools do not fit the target's context
                    print(f"{name} {label}: not measured: {err}", flush=True)
                    continue
                acceptance = measured.get("acceptance") or {}
                rows.append({"set": name, "method": label, "tok_s": measured["output_tok_s"],
                             "tokens_per_step": acceptance.get("tokens_per_step"), "tau": acceptance.get("tau_pooled"),
                             "tool_calls": measured["tool_calls"], "requests": measured["requests"],
                             "held": measured["held"]})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def cost(config: dict, sets: dict, rendering: str, parser: str | None, rows_per_set: int,
         max_tokens: int) -> list[dict]:
    target = resolve(config["target"], REPO)
    spec = ev.server_spec("vllm", target, config["server"])
    spec.tool_call_parser = parser
    out = []
    with tempfile.TemporaryDirectory() as folder, managed_server(spec, Path(folder) / "server.log") as server:
        for name, prompts in sets.items():
            settings = gen.GenerationSettings(max_tokens=max_tokens, concurrency=4, tool_rendering=rendering,
                                              tool_call_parser=parser, max_error_fraction=1.0)
            client = ChatClient(server.base_url, target.model, retry=RetryPolicy(max_attempts=2))
            files = gen.Outputs(*(Path(folder) / f"{name}.{kind}" for kind in ("jsonl", "stats", "errors", "journal")))
            stats = asyncio.run(_generate(prompts[:rows_per_set], client, settings, files, name))
            records = stats["records"] or 1
            out.append({"set": name, "rows": stats["records"],
                        "prompt_tokens_per_row": stats["prompt_tokens"] / records,
                        "completion_tokens_per_row": stats["completion_tokens"] / records,
                        "seconds_per_row": stats["wall_s_this_run"] / records,
                        "tool_calls": stats.get("tool_calls", 0), "cuts": stats.get("cuts_by_reason", {}),
                        "ends_at_call": stats.get("ends_at_call", 0),
                        "fewer_calls": stats.get("fewer_calls", 0), "errors": stats["errors"]})
            print(json.dumps(out[-1]), flush=True)
    return out


async def _generate(prompts, client, settings, files, name) -> dict:
    try:
        return await gen.generate(prompts, client, settings, files, max_samples=None, token_budget=None, dataset=name)
    finally:
        await client.aclose()


def tables(serving_rows: list[dict], cost_rows: list[dict]) -> list[str]:
    alone = {r["set"]: r["tok_s"] for r in serving_rows if r["method"] == "target alone"}
    serving_rows = [r for r in serving_rows if r["set"] in alone]
    lines = ["| set | method | tok/s | speed-up | tokens per step | τ | tool calls / requests | held |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    for r in serving_rows:
        per_step = "–" if r["tokens_per_step"] is None else f"{r['tokens_per_step']:.3f}"
        tau = "–" if r["tau"] is None else f"{r['tau']:.3f}"
        lines.append(f"| {r['set']} | {r['method']} | {r['tok_s']:.1f} | {r['tok_s'] / alone[r['set']]:.2f}× | "
                     f"{per_step} | {tau} | {r['tool_calls']} / {r['requests']} | {r['held']} |")
    lines += ["", "| set | rows | prompt tokens / row | completion tokens / row | s / row | tool calls | cuts | "
              "ends at a call | fewer calls | failed |", "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    lines += [f"| {r['set']} | {r['rows']} | {r['prompt_tokens_per_row']:.0f} | {r['completion_tokens_per_row']:.0f} | "
              f"{r['seconds_per_row']:.2f} | {r['tool_calls']} | {dict(Counter(r['cuts'])) or '–'} | "
              f"{r['ends_at_call']} | {r['fewer_calls']} | {r['errors']} |" for r in cost_rows]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a finished workflow folder (its results/drafter/)")
    parser.add_argument("--config", type=Path, required=True, help="the config the run was made with")
    parser.add_argument("--sets", nargs="+", default=["bfcl:simple_python", "bfcl:multiple", "bfcl:parallel",
                                                      "bfcl:multi_turn_base"])
    parser.add_argument("--max-samples", type=int, default=24)
    parser.add_argument("--rows", type=int, default=16, help="rows of each set regenerated for the cost per row")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--tool-call-parser", help="the target's parser, for a template that renders tools")
    args = parser.parse_args()
    config = validate_config(load_layers([WORKFLOW_DIR / EMBEDDED, args.config.resolve()], {}))
    run = args.run.resolve()
    os.chdir(run)  # the run's relative paths: its prepared target under results/models
    sets = prompt_sets(config, args.sets, args.max_samples)
    tokenizer = load_tokenizer(resolve(config["target"], REPO))
    rendering = "text" if tool_template_problem(tokenizer, config["target"]["chat_template_kwargs"], "template") \
        else "template"
    print(f"tools reach the target as: {rendering}", flush=True)
    parser_name = None if rendering == "text" else args.tool_call_parser
    serving_rows = serving(run, config, sets, rendering, parser_name, args.k, args.concurrency, args.max_tokens)
    cost_rows = cost(config, sets, rendering, parser_name, args.rows, args.max_tokens)
    (run / "tool_sets.json").write_text(json.dumps({"serving": serving_rows, "cost": cost_rows}, indent=1))
    print("\n".join(tables(serving_rows, cost_rows)))


if __name__ == "__main__":
    main()
