"""BFCL multi-turn regenerated against a scripted target that does not follow the ground truth step by step: what
generation makes of each way a real target departs from it (cuts by reason, ends at a call, execution errors by
reason) and the share of rows regenerated to their last user turn. CPU only, no server: the target is a scripted
client answering each request from the row's ground-truth calls for the user turn it is in.

Scripts (each run over the whole set):
- ``faithful``: the turn's ground-truth calls one per answer, in order, then a text answer;
- ``out_of_order``: the turn's first two calls swapped;
- ``parallel``: all the turn's calls in one answer;
- ``extra_ls``: an ``ls()`` before the turn's calls (an unknown function where the row has no file system);
- ``other_arguments``: the turn's first call with its first string argument changed.

``--code`` runs another checkout's code (``git worktree add`` of main for the figures before a change):

    .venv/bin/python benchmarks/bfcl_live.py --code /path/to/checkout --rows 200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

SCRIPTS = ("faithful", "out_of_order", "parallel", "extra_ls", "other_arguments")


def scripted(steps: list[list[dict]], script: str) -> list[list[dict]]:
    """A user turn's answers under ``script``: each a list of calls (name, arguments), from the turn's ground-truth
    steps (one call each)."""
    calls = [{"name": r["name"], "arguments": r.get("arguments", {})} for step in steps for r in step]
    if script == "out_of_order" and len(calls) > 1:
        calls[0], calls[1] = calls[1], calls[0]
    if script == "parallel":
        return [calls] if calls else []
    if script == "extra_ls":
        calls = [{"name": "ls", "arguments": {}}, *calls]
    if script == "other_arguments" and calls:
        args = dict(calls[0]["arguments"])
        key = next((k for k, v in args.items() if isinstance(v, str)), None)
        if key is not None:
            args[key] += "_other"
        calls[0] = {**calls[0], "arguments": args}
    return [[call] for call in calls]


class ScriptedTarget:
    """A client whose answers follow ``script`` from the ground-truth steps of the user turn being answered (read
    from the request: the row by its first user turn, the turn by the user messages, the place by the answers)."""

    def __init__(self, prompts: list, script: str, result_type):
        self.rows = {p.turns[0]: p for p in prompts}
        self.script = script
        self.result_type = result_type
        self.stats = type("Stats", (), {"retries": 0, "retries_by_class": {}})()
        self.requests_by_endpoint: list = []

    async def chat(self, messages, body, tools=None, text_tool_calls=None):
        users = [i for i, m in enumerate(messages) if m["role"] == "user"]
        prompt = self.rows[messages[users[0]]["content"]]
        turn = len(users) - 1
        place = sum(m["role"] == "assistant" for m in messages[users[-1]:])
        steps = (prompt.tool_steps or [])[turn] if turn < len(prompt.tool_steps or []) else []
        answers = scripted(steps, self.script)
        calls = answers[place] if place < len(answers) else []
        tool_calls = [{"id": f"call_{turn}_{place}_{i}", "type": "function",
                       "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
                      for i, c in enumerate(calls)] or None
        return self.result_type(content=None if calls else "done", reasoning=None,
                                finish_reason="tool_calls" if calls else "stop", prompt_tokens=1,
                                completion_tokens=1, attempts=1, tool_calls=tool_calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--source", default="bfcl:multi_turn_base")
    args = parser.parse_args()
    sys.path.insert(0, str(args.code))
    import logging

    from draftsmith.data.datasets import load_prompts, resolve_source
    from draftsmith.generation import generate as gen
    from draftsmith.generation.client import ChatResult

    logging.disable(logging.WARNING)
    prompts = load_prompts(resolve_source(args.source, Path(".")), max_samples=args.rows).prompts
    print(f"code: {args.code}; {len(prompts)} rows of {args.source}")
    for script in SCRIPTS:
        with tempfile.TemporaryDirectory() as folder:
            out = Path(folder)
            outputs = gen.Outputs(out / "r.jsonl", out / "s.json", out / "e.jsonl", out / "j.jsonl")
            settings = gen.GenerationSettings(concurrency=8, max_error_fraction=1.0, return_token_ids=False)
            begun = time.monotonic()
            stats = asyncio.run(gen.generate(prompts, ScriptedTarget(prompts, script, ChatResult), settings, outputs,
                                             max_samples=None, token_budget=None, dataset=script))
            wall = time.monotonic() - begun
            records = [json.loads(line) for line in (out / "r.jsonl").read_text().splitlines()]
        turns = {p.id: len(p.turns) for p in prompts}
        to_last = sum(sum(m["role"] == "user" for m in r["messages"]) == turns[r["id"]] and "cut" not in r
                      for r in records)
        errors = stats.get("execution_errors_by_reason", Counter())
        print(f"{script:16s} rows {stats['records']:3d}  to last user turn {to_last / len(prompts):6.1%}  "
              f"cuts {sum(stats['cuts_by_reason'].values()):3d} {dict(sorted(stats['cuts_by_reason'].items()))}  "
              f"ends_at_call {stats['ends_at_call']:3d}  calls {stats['tool_calls']:4d}  "
              f"(ground truth {stats.get('calls_expected', '-')})  steps {stats.get('executed_steps', '-')}  "
              f"execution errors {dict(sorted(errors.items()))}  "
              f"set-up failed {stats.get('setup_failed', '-')}  {wall:.1f} s", flush=True)


if __name__ == "__main__":
    main()
