"""BFCL's single-turn sets (``simple_python``, ``multiple``, ``parallel``) regenerated against a scripted target, as
``benchmarks/bfcl_live.py`` does the multi-turn ones: what generation makes of a set whose rows end at the call
(cuts by reason, ends at a call, turns holding the parser's markup with no call read, and whether the job's log warns
"check target.tool_call_parser"). CPU only, no server: the target is a scripted client answering each row from its
ground truth (BFCL's ``possible_answer``, the first value each argument allows), the endpoint's parser ``hermes``.

Scripts (each run over the whole set):
- ``ground_truth``: the row's calls in one answer (``parallel``: all of them), then a text answer;
- ``one_call_per_answer``: the row's calls one per answer;
- ``unparsed``: the calls written as Hermes ``<tool_call>`` blocks in the text, none parsed (an endpoint whose parser
  is not the target's);
- ``text``: a text answer, no call.

``--code`` runs another checkout's code (``git worktree add`` of main for the figures before a change):

    .venv/bin/python benchmarks/bfcl_single_turn.py --code /path/to/checkout
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

SCRIPTS = ("ground_truth", "one_call_per_answer", "unparsed", "text")
SETS = ("simple_python", "multiple", "parallel")


def ground_truth(bfcl, category: str) -> dict[str, list[dict]]:
    """Each row's calls (OpenAI names, each argument its first allowed value; an optional one left out)."""
    path = bfcl.data_dir(category) / "possible_answer" / f"BFCL_v4_{category}.json"
    calls = {}
    for line in path.read_text().splitlines():
        answer = json.loads(line)
        calls[answer["id"]] = [{"name": bfcl.tool_name(name), "arguments": {k: v[0] for k, v in args.items()
                                                                             if v and v[0] != ""}}
                               for call in answer["ground_truth"] for name, args in call.items()]
    return calls


class ScriptedTarget:
    """A client whose answers follow ``script`` from the row's ground-truth calls (the row read from its user turn,
    the place from the answers so far)."""

    def __init__(self, prompts: list, calls: dict[str, list[dict]], script: str, result_type):
        self.calls = {p.turns[0]: calls[p.id] for p in prompts}
        self.script = script
        self.result_type = result_type
        self.stats = type("Stats", (), {"retries": 0, "retries_by_class": {}})()
        self.requests_by_endpoint: list = []

    def answers(self, calls: list[dict]) -> list[list[dict]]:
        if self.script == "ground_truth":
            return [calls]
        if self.script == "one_call_per_answer":
            return [[c] for c in calls]
        return []

    async def chat(self, messages, body, tools=None, text_tool_calls=None):
        user = next(m["content"] for m in messages if m["role"] == "user")
        place = sum(m["role"] == "assistant" for m in messages)
        answers = self.answers(self.calls[user])
        calls = answers[place] if place < len(answers) else []
        tool_calls = [{"id": f"call_{place}_{i}", "type": "function",
                       "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
                      for i, c in enumerate(calls)] or None
        text = "done"
        if self.script == "unparsed":
            text = "".join(f"<tool_call>\n{json.dumps(c)}\n</tool_call>" for c in self.calls[user])
        return self.result_type(content=None if calls else text, reasoning=None,
                                finish_reason="tool_calls" if calls else "stop", prompt_tokens=1,
                                completion_tokens=1, attempts=1, tool_calls=tool_calls)


class Warnings(logging.Handler):
    """The job's warnings that name the tool-call parser."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.parser: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "tool_call_parser" in record.getMessage():
            self.parser.append(record.getMessage())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--rows", type=int, default=None)
    args = parser.parse_args()
    sys.path.insert(0, str(args.code))
    from draftsmith.data import bfcl
    from draftsmith.data.datasets import load_prompts, resolve_source
    from draftsmith.generation import generate as gen
    from draftsmith.generation.client import ChatResult

    warnings = Warnings()
    job_log = logging.getLogger("draftsmith.generation.generate")
    job_log.addHandler(warnings)
    job_log.propagate = False
    print(f"code: {args.code}")
    for category in SETS:
        prompts = load_prompts(resolve_source(f"bfcl:{category}", Path(".")), max_samples=args.rows).prompts
        calls = ground_truth(bfcl, category)
        for script in SCRIPTS:
            warnings.parser.clear()
            with tempfile.TemporaryDirectory() as folder:
                out = Path(folder)
                outputs = gen.Outputs(out / "r.jsonl", out / "s.json", out / "e.jsonl", out / "j.jsonl")
                settings = gen.GenerationSettings(concurrency=8, max_error_fraction=1.0, return_token_ids=False,
                                                  tool_call_parser="hermes")
                begun = time.monotonic()
                stats = asyncio.run(gen.generate(prompts, ScriptedTarget(prompts, calls, script, ChatResult),
                                                 settings, outputs, max_samples=None, token_budget=None,
                                                 dataset=category))
                wall = time.monotonic() - begun
            print(f"{category:14s} {script:20s} rows {stats['records']:3d}  "
                  f"cuts {sum(stats['cuts_by_reason'].values()):3d} {dict(sorted(stats['cuts_by_reason'].items()))}  "
                  f"ends_at_call {stats.get('ends_at_call', '-')}  calls {stats['tool_calls']:4d}  "
                  f"unparsed markup {stats.get('unparsed_call_markup', '-')}  "
                  f"parser warnings {len(warnings.parser)}  {wall:.1f} s", flush=True)


if __name__ == "__main__":
    main()
