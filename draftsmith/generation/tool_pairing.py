"""Which of the dataset's tool results answers which of the target's calls, and what a call no result
answers does to the conversation. Generation and the serving grid pair alike.

A result belongs to the call of its name *and* arguments (:func:`~draftsmith.data.tool_calls.same_arguments`):
a target that asks for London's weather where the dataset asked for Paris's is not handed Paris's. Parallel
calls pair by their arguments in whatever order the target makes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from draftsmith.data.tool_calls import call_arguments, parameter_defaults, same_arguments

# datasets.<name>.generation.unmatched_calls: what a call with the name of one of the step's results but other
# arguments gets. cut (the default): the conversation ends there, its turn kept, counted as other_arguments;
# by_name: the result of that name all the same, counted and labelled semi-on-policy; execute: every call of the
# target's runs on the row's own tool instances (a row with an environment, BFCL multi-turn: the default there).
UNMATCHED_CALLS = ("cut", "by_name", "execute")

# The markup that opens a call in the target's text, per vLLM tool-call parser (vllm/parser/*.py and
# vllm/tool_parsers/*.py, vLLM 0.32): left in a turn's text with no call read, it says the parser did not
# read the target's calls (another parser, or none).
PARSER_MARKUP = {
    **dict.fromkeys(("hermes", "qwen3_json", "qwen3_coder", "qwen3_xml", "glm45", "glm47", "granite4", "xlam",
                     "ernie45"), "<tool_call>"),
    "kimi_k2": "<|tool_calls_section_begin|>",
    "deepseek_v3": "<｜tool▁calls▁begin｜>",
    "deepseek_v31": "<｜tool▁calls▁begin｜>",
    "deepseek_v41": "<｜DSML｜ calls>",
    "mistral": "[TOOL_CALLS]",
    "llama3_json": "<|python_tag|>",
    "llama4_json": "<|python_tag|>",
    "jamba": "<tool_calls>",
    "minimax_m2": "<minimax:tool_call>",
    "granite": "<|tool_call|>",
    "internlm": "<|action_start|><|plugin|>",
    "gemma4": "<|tool_call>",
    "phi4_mini_json": "functools[",
}
TEXT_MARKUP = "<tool_call>"  # tokenize.tool_rendering: text, read by draftsmith.data.chat.parse_text_tool_calls


def call_markup(parser: str | None, tool_rendering: str) -> tuple[str, ...]:
    """The markup whose presence in a turn without calls points to a parser problem: the parser's own; every
    known parser's where the endpoint's parser is not known (an external server); none for a parser without
    markup of its own (pythonic)."""
    if tool_rendering == "text":
        return (TEXT_MARKUP,)
    if parser is None:
        return tuple(sorted(set(PARSER_MARKUP.values())))
    return (PARSER_MARKUP[parser],) if parser in PARSER_MARKUP else ()


@dataclass
class Pairing:
    """One turn's calls against the dataset: the ``tool`` messages answering them, or why the conversation
    stops. ``cut``: a call no result answers where the data goes on; ``ends_at_call``: the data holds nothing
    after this point (no result, no later turn), so the conversation ends at the target's calls, no cut;
    ``by_name``: calls answered with their name's result although their arguments differ."""

    answers: list[dict] = field(default_factory=list)
    cut: str | None = None
    ends_at_call: bool = False
    by_name: int = 0


def pair_calls(calls: list[dict], steps: list[list[dict]], tools: list[dict] | None = None,
               unmatched: str = "cut", data_ends_here: bool = False) -> Pairing:
    """Answer one turn's ``calls`` with the stretch's next dataset step (taken from ``steps``). Each call
    takes an unused result of its name and the same arguments; a call left over takes a result of its name
    with other arguments only where ``unmatched`` is ``by_name``. No step left: the conversation ends at the
    calls where ``data_ends_here`` (the row's last stretch, its data stopping after a call), else it is cut.
    A result without ``arguments`` pairs by name (a dataset that does not say what was called)."""
    if not steps:
        return Pairing(ends_at_call=True) if data_ends_here else Pairing(cut="more_calls_than_results")
    step = steps.pop(0)
    if len(calls) > len(step):
        return Pairing(cut="parallel_calls")
    unused = list(step)
    paired: dict[int, dict] = {}
    for index, call in enumerate(calls):  # same name and arguments first, so a by-name answer takes no call's own
        function = call["function"]
        arguments = call_arguments(function.get("arguments"))
        defaults = parameter_defaults(tools, function["name"])
        result = next((r for r in unused if r["name"] == function["name"] and (
            "arguments" not in r or (arguments is not None and same_arguments(arguments, r["arguments"], defaults)))),
            None)
        if result is not None:
            unused.remove(result)
            paired[index] = result
    by_name = 0
    for index, call in enumerate(calls):
        if index in paired:
            continue
        result = next((r for r in unused if r["name"] == call["function"]["name"]), None)
        if result is None:
            return Pairing(cut="other_function")
        if unmatched != "by_name":
            return Pairing(cut="other_arguments")
        unused.remove(result)
        paired[index] = result
        by_name += 1
    answers = [{"role": "tool", "tool_call_id": call["id"], "name": paired[i]["name"], "content": paired[i]["content"]}
               for i, call in enumerate(calls)]
    return Pairing(answers, by_name=by_name)
