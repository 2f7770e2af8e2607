"""Regeneration of rows with tools against a server that calls tools as the prompt scripts it
(tests/sim/tool_server.py): pairing with the dataset's results, cuts, resume, parser flags."""

import asyncio
import importlib.util
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from draftsmith.config.target import Target
from draftsmith.core.digest import json_digest
from draftsmith.data.chat import TokenizeSettings, tokenize_file
from draftsmith.data.datasets import Prompt
from draftsmith.data.tool_calls import same_arguments
from draftsmith.generation import server as server_module
from draftsmith.generation.client import ChatClient, RetryPolicy
from draftsmith.generation.generate import (
    KEY_LENGTH,
    RECORD_FORMAT,
    GenerationFailed,
    GenerationSettings,
    Outputs,
    generate,
    make_client,
    settings_key,
    tool_options,
)
from draftsmith.generation.server import ServerSpec, check_tool_call_parser, generation_spec
from draftsmith.generation.tool_pairing import pair_calls
from tests.conftest import REPO
from tests.sim.tool_server import ToolSim
from tests.tiny_targets import QWEN3_TOKENIZER

TOOLS = [{"type": "function", "function": {"name": name, "description": f"the {name} tool",
                                           "parameters": {"type": "object", "properties": {}}}}
         for name in ("a", "b", "c")]


@pytest.fixture()
def sim():
    with ToolSim() as server:
        yield server


def outputs(tmp_path):
    return Outputs(tmp_path / "out.jsonl", tmp_path / "stats.json", tmp_path / "errors.jsonl",
                   tmp_path / "journal" / "j.jsonl")


def run(sim, prompts, tmp_path, context=None, **settings):
    settings = GenerationSettings(**{"concurrency": 4, "request_timeout_s": 5.0, "max_error_fraction": 0.0,
                                     "return_token_ids": True, **settings})
    client = make_client(sim.base_url, "m", settings, None, None)
    client.retry = RetryPolicy(max_attempts=2, backoff_base_s=0.01, backoff_max_s=0.02)

    async def go():
        try:
            return await generate(prompts, client, settings, outputs(tmp_path), max_samples=None, token_budget=None,
                                  dataset="d", context=context)
        finally:
            await client.aclose()

    return asyncio.run(go())


def records(tmp_path):
    return {r["id"]: r for r in map(json.loads, (tmp_path / "out.jsonl").read_text().splitlines())}


def result(name, content=None):
    return {"name": name, "content": content or f"result of {name}"}


def T(pid, turns, steps, tools=TOOLS):
    return Prompt(pid, turns, tools=tools, tool_steps=steps)


def test_calls_are_paired_in_order_with_the_dataset_results(sim, tmp_path):
    prompt = T("p", ["weather? calls=a,b"], [[[result("a", "sunny")], [result("b", "warm")]]])
    stats = run(sim, [prompt], tmp_path)
    record = records(tmp_path)["p"]
    roles = [m["role"] for m in record["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    first, answer_a, call_b, answer_b = record["messages"][1:5]
    assert first["tool_calls"][0]["function"] == {"name": "a", "arguments": '{"step": 0}'} and first["content"] == ""
    assert answer_a == {"role": "tool", "tool_call_id": first["tool_calls"][0]["id"], "name": "a", "content": "sunny"}
    assert call_b["tool_calls"][0]["function"]["name"] == "b" and answer_b["content"] == "warm"
    assert record["messages"][-1] == {"role": "assistant", "content": "answer 2 done"}
    assert len(record["turns"]) == 3 and all(t["token_ids"] for t in record["turns"])  # the tool-call turns' own ids
    assert record["tools"] == TOOLS and record["tool_calls"] == 2 and record["fewer_calls"] is False
    assert "cut" not in record and record["tool_call_tokens"] == "model"
    assert all(body["tools"] == TOOLS and body["tool_choice"] == "auto" for body in sim.requests)
    assert len(sim.requests) == 3
    assert stats["rows_with_tools"] == 1 and stats["tool_calls"] == 2 and stats["cuts_by_reason"] == {}
    assert stats["fewer_calls"] == 0 and stats["tool_call_token_source"] == {"model": 1}


@pytest.mark.parametrize(("script", "steps", "reason"), [
    ("calls=c", [[result("a")]], "other_function"),
    ("calls=a,a", [[result("a")]], "more_calls_than_results"),
    ("calls=a+b", [[result("a")]], "parallel_calls"),
    ("calls=a+c", [[result("a"), result("b")]], "other_function"),
])
def test_a_call_that_cannot_be_paired_cuts_the_conversation_keeping_its_turn(sim, tmp_path, script, steps, reason,
                                                                             caplog):
    later = [[result("a")]]  # the second user turn is never asked
    stats = run(sim, [T("p", [f"go {script}", "and then? calls=a"], [steps, later])], tmp_path)
    assert "tool_call_parser" not in caplog.text  # the target's choice, counted: no parser to blame
    record = records(tmp_path)["p"]
    assert record["cut"] == reason and stats["cuts_by_reason"] == {reason: 1}
    assert record["messages"][-1]["role"] == "assistant" and record["messages"][-1]["tool_calls"]  # kept, unanswered
    assert [m["role"] for m in record["messages"]].count("user") == 1
    assert len(record["turns"]) == sum(m["role"] == "assistant" for m in record["messages"])


def test_parallel_calls_are_answered_by_name_in_whatever_order_the_model_makes_them():
    """A target that calls [b, a] where the dataset's step holds [a, b] (parallel calls have no order), or calls b
    alone, gets b's result, not a cut; two calls of one name take that name's results in order."""
    def call(name: str, i: int) -> dict:
        return {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": "{}"}}

    step = [{"name": "a", "content": "A1"}, {"name": "b", "content": "B"}, {"name": "a", "content": "A2"}]
    pairing = pair_calls([call("b", 0), call("a", 1), call("a", 2)], [list(step)])
    assert pairing.cut is None and [(m["tool_call_id"], m["content"]) for m in pairing.answers] == [
        ("c0", "B"), ("c1", "A1"), ("c2", "A2")]
    assert pair_calls([call("b", 0)], [list(step)]).answers[0]["content"] == "B"
    assert pair_calls([call("a", 0), call("a", 1), call("a", 2)], [list(step)]).cut == "other_function"


WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "units": {"type": "string", "default": "metric"}, "days": {"type": "integer"}}}}}]


def weather_call(i: int, arguments: dict | str) -> dict:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": f"c{i}", "type": "function", "function": {"name": "get_weather", "arguments": text}}


def weather(city: str, **more) -> dict:
    return {"name": "get_weather", "arguments": {"city": city, **more}, "content": f"weather of {city}"}


def test_a_result_goes_to_the_call_of_its_arguments_and_parallel_calls_pair_by_them():
    """Issue 57: a target asking for London where the dataset asked for Paris was handed Paris's result, and two
    parallel calls of one function in the other order got each other's results."""
    london = pair_calls([weather_call(0, {"city": "London"})], [[weather("Paris")]], WEATHER)
    assert london.cut == "other_arguments" and not london.answers
    semi = pair_calls([weather_call(0, {"city": "London"})], [[weather("Paris")]], WEATHER, unmatched="by_name")
    assert semi.cut is None and semi.by_name == 1 and semi.answers[0]["content"] == "weather of Paris"
    swapped = pair_calls([weather_call(0, {"city": "Oslo"}), weather_call(1, {"city": "Paris"})],
                         [[weather("Paris"), weather("Oslo")]], WEATHER)
    assert [(m["tool_call_id"], m["content"]) for m in swapped.answers] == [("c0", "weather of Oslo"),
                                                                            ("c1", "weather of Paris")]
    # by_name takes what no call's own arguments claim: Oslo's call keeps Oslo's result
    mixed = pair_calls([weather_call(0, {"city": "Rome"}), weather_call(1, {"city": "Oslo"})],
                       [[weather("Oslo"), weather("Paris")]], WEATHER, unmatched="by_name")
    assert [m["content"] for m in mixed.answers] == ["weather of Paris", "weather of Oslo"] and mixed.by_name == 1


@pytest.mark.parametrize(("a", "b", "defaults", "same"), [
    ({"days": None}, {}, {}, False),  # null is a value: no default, so not what leaving it out asks
    ({"days": None}, {}, {"days": None}, True),  # absent equals the schema's default only, here null
    ({"days": None}, {}, {"days": 1}, False),  # null is not "the default": the function gets None, not 1
    ({}, {"days": 1}, {"days": 1}, True),
    ({"days": None}, {"days": None}, {}, True),
])
def test_an_argument_given_as_null_is_a_value_and_absent_equals_only_the_default(a, b, defaults, same):
    assert same_arguments(a, b, defaults) is same and same_arguments(b, a, defaults) is same


@pytest.mark.parametrize(("called", "dataset", "same"), [
    ('{"days": 2, "city": "Paris"}', {"city": "Paris", "days": 2}, True),  # key order ignored
    ({"city": "Paris", "days": 2.0}, {"city": "Paris", "days": 2}, True),  # numbers by value
    ({"city": "Paris", "units": "metric"}, {"city": "Paris"}, True),  # left out at the schema's default
    ({"city": "Paris"}, {"city": "Paris", "units": "metric"}, True),
    ({"city": "Paris", "units": "imperial"}, {"city": "Paris"}, False),
    ({"city": "Paris", "days": 1}, {"city": "Paris"}, False),  # no default: absent is not 1
    ({"city": "Paris", "days": True}, {"city": "Paris", "days": 1}, False),  # a boolean is not a number
    ({"city": "paris"}, {"city": "Paris"}, False),  # strings exact
    ("not json", {"city": "Paris"}, False),
])
def test_arguments_compare_as_json_objects(called, dataset, same):
    pairing = pair_calls([weather_call(0, called)], [[weather(**dataset)]], WEATHER)
    assert (pairing.cut is None) is same and (pairing.cut or "other_arguments") == "other_arguments"


def test_a_call_with_other_arguments_cuts_through_the_endpoint_or_is_answered_by_name_and_labelled(sim, tmp_path):
    prompt = T("p", ["weather? calls=get_weather:city=London"], [[[weather("Paris")]]], tools=WEATHER)
    stats = run(sim, [prompt], tmp_path)
    record = records(tmp_path)["p"]
    assert record["cut"] == "other_arguments" and record["messages"][-1]["tool_calls"]  # its turn kept
    assert stats["cuts_by_reason"] == {"other_arguments": 1} and stats["results_by_name"] == 0
    semi = tmp_path / "semi"
    stats = run(sim, [prompt], semi, unmatched_calls="by_name")
    record = records(semi)["p"]
    assert "cut" not in record and record["results_by_name"] == 1 and stats["results_by_name"] == 1
    assert [m["content"] for m in record["messages"] if m["role"] == "tool"] == ["weather of Paris"]


def test_unmatched_calls_names_the_journal_only_where_it_changes_answers():
    base = GenerationSettings()
    assert settings_key("m", GenerationSettings(unmatched_calls="cut")) == settings_key("m", base)
    assert settings_key("m", GenerationSettings(unmatched_calls="by_name")) != settings_key("m", base)
    with pytest.raises(ValueError, match=r"generation\.unmatched_calls: 'run' is not one of cut, by_name, execute"):
        GenerationSettings(unmatched_calls="run")


def test_a_conversation_whose_data_ends_at_a_call_ends_at_the_targets_calls_uncut(sim, tmp_path, caplog):
    """A single-turn tool set (BFCL simple, xLAM, a prompt with tools) has no result after its call: the target's
    call ends the conversation, counted as ends_at_call, no cut and no warning. Where the data goes on (a later
    turn, or an answer after the results) a call beyond the results stays a cut."""
    single = Prompt("single", ["weather? calls=a"], tools=TOOLS, tool_steps=[[]], open_end=True)
    trajectory = T("trajectory", ["go calls=a,b"], [[[result("a")]]])  # its data stops at an unanswered call
    trajectory = Prompt(trajectory.id, trajectory.turns, tools=TOOLS, tool_steps=trajectory.tool_steps, open_end=True)
    goes_on = Prompt("goes_on", ["first calls=a", "second"], tools=TOOLS, tool_steps=[[], []], open_end=True)
    answered = T("answered", ["go calls=a,b"], [[[result("a")]]])  # the data answered in text after a's result
    stats = run(sim, [single, trajectory, goes_on, answered], tmp_path)
    got = records(tmp_path)
    assert got["single"]["ends_at_call"] is True and "cut" not in got["single"]
    assert [m["role"] for m in got["single"]["messages"]] == ["user", "assistant"]
    assert got["trajectory"]["ends_at_call"] is True and got["trajectory"]["tool_calls"] == 2
    assert got["goes_on"]["cut"] == "more_calls_than_results" and "ends_at_call" not in got["goes_on"]
    assert got["answered"]["cut"] == "more_calls_than_results"
    assert stats["ends_at_call"] == 2 and stats["cuts_by_reason"] == {"more_calls_than_results": 2}
    assert "tool_call_parser" not in caplog.text


def test_call_markup_no_parser_read_is_counted_and_warned_about(tmp_path, caplog):
    """The endpoint's parser did not read the target's calls (here: none ran, the calls stay in the text)."""
    with ToolSim(text=True) as sim:
        stats = run(sim, [T("p", ["weather? calls=a"], [[[result("a")]]])], tmp_path, tool_call_parser="hermes")
    record = records(tmp_path)["p"]
    assert record["unparsed_call_markup"] == 1 and record["tool_calls"] == 0 and "cut" not in record
    assert stats["unparsed_call_markup"] == 1
    assert "1 of 1 conversations with tools hold a turn whose text has the tool-call parser's markup" in caplog.text
    assert "check target.tool_call_parser" in caplog.text


def test_fewer_calls_is_a_natural_end_and_the_next_user_turn_follows(sim, tmp_path):
    prompt = T("p", ["first calls=a", "second calls=b+c"],
               [[[result("a")], [result("b")]], [[result("b"), result("c"), result("a")]]])
    stats = run(sim, [prompt, Prompt("plain", ["hello"])], tmp_path)
    record = records(tmp_path)["p"]
    assert [m["role"] for m in record["messages"]] == ["user", "assistant", "tool", "assistant",
                                                       "user", "assistant", "tool", "tool", "assistant"]
    assert [m.get("name") for m in record["messages"][6:8]] == ["b", "c"]  # fewer calls than the step: the first
    assert record["fewer_calls"] is True and "cut" not in record and record["tool_calls"] == 3
    assert stats["fewer_calls"] == 1 and stats["cuts_by_reason"] == {} and stats["rows_with_tools"] == 1


def test_tools_rendered_as_text_travel_in_the_messages_and_calls_are_read_from_the_answer(tmp_path):
    with ToolSim(text=True) as sim:
        stats = run(sim, [T("p", ["weather? calls=a,b+c"], [[[result("a", "sunny")], [result("b"), result("x")]]])],
                    tmp_path, tool_rendering="text")
    record = records(tmp_path)["p"]
    assert record["cut"] == "other_function" and record["tool_rendering"] == "text" and record["tool_calls"] == 3
    first, answer_a, second = record["messages"][1:]
    assert "tool_calls" not in first and first["content"].startswith('<tool_call>\n{"name": "a"')  # as the model wrote
    assert answer_a["role"] == "tool" and answer_a["content"] == "sunny" and second["content"].count("<tool_call>") == 2
    assert all("tools" not in body and "tool_choice" not in body for body in sim.requests)
    assert "<tools>" in sim.requests[0]["messages"][0]["content"]
    assert sim.requests[1]["messages"][-1] == {"role": "user", "content": "<tool_response>\nsunny\n</tool_response>"}
    assert stats["cuts_by_reason"] == {"other_function": 1}


def test_a_length_finish_ends_the_conversation_uncut(sim, tmp_path):
    run(sim, [T("p", ["calls=a,b length=1", "more"], [[[result("a")], [result("b")]], []])], tmp_path)
    record = records(tmp_path)["p"]
    assert record["finish_reasons"] == ["tool_calls", "length"] and "cut" not in record
    assert [m["role"] for m in record["messages"]] == ["user", "assistant", "tool", "assistant"]


def test_rows_without_tools_keep_their_requests_and_records(sim, tmp_path):
    run(sim, [Prompt("plain", ["hello calls=a"])], tmp_path)
    assert all("tools" not in body and "tool_choice" not in body for body in sim.requests)
    assert set(records(tmp_path)["plain"]) == {"format", "id", "prompt_hash", "status", "messages", "finish_reason",
                                               "finish_reasons", "usage", "turns", "latency_s"}


def test_without_token_ids_the_template_renders_the_calls(sim, tmp_path):
    stats = run(sim, [T("p", ["calls=a"], [[[result("a")]]])], tmp_path, return_token_ids=False)
    assert records(tmp_path)["p"]["tool_call_tokens"] == "template"
    assert stats["tool_call_token_source"] == {"template": 1}


def test_a_changed_tool_result_is_regenerated_and_nothing_else(sim, tmp_path):
    rows = [T(f"p{i}", [f"q{i} calls=a"], [[[result("a", "r")]]]) for i in range(3)]
    run(sim, rows, tmp_path)
    assert len(sim.requests) == 6
    edited = T("p1", ["q1 calls=a"], [[[result("a", "another result")]]])
    assert edited.digest != rows[1].digest
    run(sim, [rows[0], edited, rows[2]], tmp_path)
    assert len(sim.requests) == 8 and {b["messages"][0]["content"] for b in sim.requests[6:]} == {"q1 calls=a"}
    assert records(tmp_path)["p1"]["messages"][2]["content"] == "another result"


def test_a_malformed_tool_call_is_retried_then_counted(tmp_path):
    class Nameless(ToolSim):
        def _answer_at(self, script, place, body):
            answer = super()._answer_at(script, place, body)
            for call in answer["choices"][0]["message"].get("tool_calls") or []:
                del call["function"]["name"]
            return answer

    with Nameless() as sim:
        settings = {"max_error_fraction": 1.0}
        stats = run(sim, [T("p", ["calls=a"], [[[result("a")]]])], tmp_path, **settings)
    assert stats["errors_by_class"] == {"malformed_response": 1} and len(sim.requests) == 2


DRIVER = """
import asyncio, sys
from pathlib import Path
from draftsmith.data.chat import TokenizeSettings, tokenize_file
from draftsmith.data.datasets import Prompt
from draftsmith.generation.generate import GenerationSettings, Outputs, generate, make_client
url, out = sys.argv[1], Path(sys.argv[2])
tools = [{"type": "function", "function": {"name": "a", "parameters": {"type": "object", "properties": {}}}}]
prompts = [Prompt(f"p{i}", [f"q{i} calls=a,a delay={0.1 * (i % 3):.1f}"], tools=tools,
                  tool_steps=[[[{"name": "a", "content": "r"}], [{"name": "a", "content": "s"}]]]) for i in range(24)]
settings = GenerationSettings(concurrency=3, fsync_every=1)
async def main():
    client = make_client(url, "m", settings, None, None)
    try:
        await generate(prompts, client, settings, Outputs(out / "r.jsonl", out / "s.json", out / "e.jsonl",
                       out / "j.jsonl"), max_samples=None, token_budget=None, dataset="d")
    finally:
        await client.aclose()
asyncio.run(main())
"""


def test_a_killed_run_resumes_without_asking_a_journaled_conversation_again(sim, tmp_path):
    def start():
        return subprocess.Popen([sys.executable, "-c", DRIVER, sim.base_url, str(tmp_path)], cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    proc = start()
    journal = tmp_path / "j.jsonl"
    deadline = time.monotonic() + 60
    while not (journal.exists() and journal.read_text().count("\n") >= 4) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    journaled = {json.loads(line)["id"] for line in journal.read_text().splitlines() if line.endswith("}")}
    assert 4 <= len(journaled) < 24
    asked_before = len(sim.requests)
    proc = start()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    ids = [json.loads(line)["id"] for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert sorted(ids) == sorted(f"p{i}" for i in range(24))
    asked_again = {body["messages"][0]["content"].split()[0] for body in sim.requests[asked_before:]}
    assert not {f"q{pid[1:]}" for pid in journaled} & asked_again
    assert all(len(r["messages"]) == 6 for r in map(json.loads, (tmp_path / "r.jsonl").read_text().splitlines()))


def test_tool_options_ask_for_a_parser_only_where_a_managed_server_parses():
    rows, plain = [T("p", ["q"], None)], [Prompt("q", ["q"])]
    assert tool_options(plain, None, "template", "vllm", "d") == {}
    with pytest.raises(ValueError, match=r"d: its rows have tools.*target.tool_call_parser.*tool_rendering: text"):
        tool_options(rows, None, "template", "vllm", "d")
    assert tool_options(rows, "hermes", "template", "sglang", "d") == {"tool_rendering": "template",
                                                                       "tool_call_parser": "hermes",
                                                                       "reasoning": "template"}
    assert tool_options(rows, None, "text", "vllm", "d") == {"tool_rendering": "text", "reasoning": "template"}
    assert tool_options(rows, None, "template", None, "d", "drop") == {"tool_rendering": "template",
                                                                       "reasoning": "drop"}  # hosted API
    with pytest.raises(ValueError, match=r"tokenize\.tool_rendering: 'json'"):
        tool_options(rows, None, "json", None, "d")


def test_journal_names_change_with_the_tool_settings_only_where_set():
    plain = GenerationSettings()
    assert settings_key("m", plain) == settings_key("m", GenerationSettings(**tool_options([], "x", "text", None, "")))
    keys = {settings_key("m", s) for s in (plain, GenerationSettings(tool_call_parser="hermes"),
                                           GenerationSettings(tool_rendering="text"))}
    assert len(keys) == 3
    old_formula = json_digest([RECORD_FORMAT, "m", plain.answer_affecting(), plain.finish_reason_policy], KEY_LENGTH)
    assert settings_key("m", plain) == old_formula  # the name journals had before tools: kept


def test_parser_flags_for_each_engine():
    vllm = ServerSpec("m", tool_call_parser="hermes").command(1)
    assert vllm[-3:] == ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    sglang = ServerSpec("m", engine="sglang", tool_call_parser="qwen25").command(1)
    assert sglang[-2:] == ["--tool-call-parser", "qwen25"] and "--enable-auto-tool-choice" not in sglang
    assert "--tool-call-parser" not in ServerSpec("m").command(1)
    own = ServerSpec("m", tool_call_parser="hermes", extra_args=["--tool-call-parser", "mine"]).command(1)
    assert own.count("--tool-call-parser") == 1 and own[-1] == "mine"
    joined = ServerSpec("m", tool_call_parser="hermes", extra_args=["--tool-call-parser=mine"]).command(1)
    assert not any(arg.startswith("--tool-call-parser") and arg != "--tool-call-parser=mine" for arg in joined)


def test_an_unknown_parser_is_refused_before_the_server_starts(monkeypatch):
    monkeypatch.setattr(server_module, "vllm_tool_parsers", lambda: {"hermes", "kimi_k2"})  # vLLM's import: ~15 s
    server = {"host": "127.0.0.1", "port": 0, "extra_args": [], "env": {}, "startup_timeout_s": 60, "dtype": "float32"}
    gen = {"engine": "vllm", "extra_args": None, "env": {}}
    target = Target("m", "m", "hub")
    with pytest.raises(ValueError, match=r"target.tool_call_parser: 'hermes2' is not one of vLLM's.*: hermes, kimi_k2"):
        generation_spec(target, server, gen, tool_call_parser="hermes2")
    assert "hermes" in generation_spec(target, server, gen, tool_call_parser="hermes").command(1)
    sglang = generation_spec(target, server, {**gen, "engine": "sglang"}, tool_call_parser="anything")
    assert sglang.tool_call_parser == "anything"  # SGLang's list is its own start's to check


def test_vllms_parser_registry_is_where_the_check_reads_it():
    """Read from the installed vLLM's files (importing it takes ~15 s): a vLLM that moved its registry
    fails here rather than in a user's generate job."""
    package = Path(importlib.util.find_spec("vllm").origin).parent / "tool_parsers"
    assert "class ToolParserManager" in (package / "abstract_tool_parser.py").read_text()
    registry = (package / "__init__.py").read_text()
    assert "ToolParserManager" in registry and '"hermes"' in registry and "lazy_parsers" in (
        package / "abstract_tool_parser.py").read_text()


def tokenize_supervised(tokenizer, tmp_path, rendering):
    """The tokenize stage on what generation wrote: the decoded rows, and their supervised text."""
    settings = TokenizeSettings(tool_rendering=rendering, max_prompt_mismatch_fraction=1.0,
                                max_answer_mismatch_fraction=1.0)
    stats = tokenize_file(tmp_path / "out.jsonl", tokenizer, tmp_path / "t.parquet", tmp_path / "rejects.jsonl", "d",
                          settings)
    rows = pq.read_table(tmp_path / "t.parquet").to_pylist()
    assert stats["rows"] == len(rows) >= 1
    supervised = "".join(tokenizer.decode([t for t, m in zip(r["input_ids"], r["loss_mask"], strict=True) if m])
                         for r in rows)
    return "".join(tokenizer.decode(r["input_ids"]) for r in rows), supervised


CONTRACT = T("p", ["weather? calls=a", "and now? calls=b"], [[[result("a", "sunny-result")]],
                                                            [[result("c", "other-result")]]])


def test_a_text_rendered_record_tokenizes_with_its_calls_supervised_and_never_a_result(tokenizer, tmp_path):
    """The record generation writes is what the tokenize stage renders: the model's calls, as it wrote
    them, are supervised (the unpaired one that cut the conversation too); the dataset's results are not."""
    with ToolSim(text=True) as sim:
        run(sim, [CONTRACT], tmp_path, tool_rendering="text", return_token_ids=False)
    text, supervised = tokenize_supervised(tokenizer, tmp_path, "text")
    assert supervised.count('<tool_call>\n{"name": "a"') == 1 and supervised.count('{"name": "b"') == 1
    assert "sunny-result" not in supervised and "sunny-result" in text


def test_a_template_rendered_record_tokenizes_with_qwen3s_template(tmp_path):
    from transformers import AutoTokenizer

    if not (QWEN3_TOKENIZER / "tokenizer.json").is_file():
        pytest.skip(f"{QWEN3_TOKENIZER} is missing: run envs/test-assets.sh")
    with ToolSim() as sim:
        run(sim, [CONTRACT], tmp_path, return_token_ids=False)
    text, supervised = tokenize_supervised(AutoTokenizer.from_pretrained(QWEN3_TOKENIZER), tmp_path, "template")
    assert supervised.count('"name": "a"') == 1 and supervised.count('"name": "b"') == 1
    assert "sunny-result" not in supervised and "sunny-result" in text and '"name": "a"' in text.split("# Tools")[1]


def test_tool_calls_are_read_in_openai_shape_whatever_the_server_sends():
    payload = {"choices": [{"finish_reason": "tool_calls", "message": {"content": None, "tool_calls": [
        {"id": "x1", "type": "function", "function": {"name": "a", "arguments": '{"k": 1}'}},
        {"function": {"name": "b", "arguments": {"k": "é"}}}]}}], "usage": {"completion_tokens": 3}}
    result = ChatClient._parse(payload, 1)
    assert result.content == "" and result.tool_calls == [
        {"id": "x1", "type": "function", "function": {"name": "a", "arguments": '{"k": 1}'}},
        {"id": "call_1", "type": "function", "function": {"name": "b", "arguments": '{"k": "é"}'}}]
    assert ChatClient._parse({"choices": [{"message": {"content": "hi"}}]}, 1).tool_calls is None


def test_a_parser_plugin_of_the_users_own_is_not_checked():
    check_tool_call_parser("vllm", "mine", ["--tool-parser-plugin=/x/my_parser.py"])  # no vLLM import, no error


class WordTokenizer:
    """A template that joins the messages' roles and contents (and the tools' names) and a token per word: enough to
    count a prompt against a context as the target's tokenizer would."""

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False, tools=None, **kwargs):
        text = " ".join(f"{m['role']}: {m.get('content') or ''}" for m in messages)
        return text + " " + " ".join(t["function"]["name"] for t in tools or []) + (" assistant:" if
                                                                                   add_generation_prompt else "")

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": list(range(len(text.split())))}


def test_a_conversation_that_outgrows_the_context_ends_there_and_is_no_error(sim, tmp_path):
    """Issue 57: the server refused the turn that passed the context, the row became an error, and above
    max_error_fraction the job failed. Now the turn is not sent: the conversation ends with its earlier turns
    (the tool results and the user turn that would not fit dropped), or, when even its first prompt does not
    fit, is journaled as dropped_context; neither is an error."""
    from draftsmith.data.chat import Renderer
    from draftsmith.generation.generate import ContextLimit

    long_turn = "word " * 40
    prompts = [Prompt("chat", ["short question", long_turn]),
               T("tools", ["go calls=a", "more"], [[[result("a", "x " * 40)]], []]),
               Prompt("too_long", [long_turn])]
    context = ContextLimit(30, Renderer(WordTokenizer()))
    stats = run(sim, prompts, tmp_path, context=context)
    got = records(tmp_path)
    assert got["chat"]["ends_at_context"] is True and [m["role"] for m in got["chat"]["messages"]] == ["user",
                                                                                                      "assistant"]
    assert got["tools"]["ends_at_context"] is True and "cut" not in got["tools"]
    assert [m["role"] for m in got["tools"]["messages"]] == ["user", "assistant"]  # its call kept, the result not sent
    assert "too_long" not in got and stats["dropped_context"] == 1 and stats["ends_at_context"] == 2
    assert stats["errors"] == 0 and stats["records"] == 2
    assert not any(long_turn in m["content"] for body in sim.requests for m in body["messages"] if m["content"])


def test_a_prompt_the_template_cannot_render_to_count_is_an_error_of_its_row(sim, tmp_path):
    from draftsmith.data.chat import Renderer
    from draftsmith.generation.generate import ContextLimit

    class Refusing(WordTokenizer):
        def apply_chat_template(self, messages, **kwargs):
            raise ValueError("roles must alternate")

    with pytest.raises(GenerationFailed, match=r"1 of 1 prompts failed .*first: p: template: the chat template "
                                               r"cannot render the prompt .*roles must alternate"):
        run(sim, [Prompt("p", ["hi"])], tmp_path, context=ContextLimit(30, Renderer(Refusing())))
    assert not sim.requests


def test_the_models_own_ids_with_tools_come_through_an_endpoint_and_spell_its_calls(tmp_path):
    """Issue 57: the simulator's ids were range(n), so no test took the own-ids path with tools. Here the endpoint
    returns the ids Qwen3's tokenizer gives for what the model wrote (its calls as Hermes blocks), the record keeps
    them, and the tokenize stage supervises them: they spell the answers and the calls, none mismatched."""
    from transformers import AutoTokenizer

    if not (QWEN3_TOKENIZER / "tokenizer.json").is_file():
        pytest.skip(f"{QWEN3_TOKENIZER} is missing: run envs/test-assets.sh")
    tokenizer = AutoTokenizer.from_pretrained(QWEN3_TOKENIZER)
    with ToolSim(tokenizer=tokenizer) as sim:
        run(sim, [CONTRACT], tmp_path, return_token_ids=True)
    record = records(tmp_path)["p"]
    assert record["tool_call_tokens"] == "model" and tokenizer.decode(record["turns"][0]["token_ids"]).startswith(
        '<tool_call>\n{"name": "a"')
    stats = tokenize_file(tmp_path / "out.jsonl", tokenizer, tmp_path / "t.parquet", tmp_path / "rejects.jsonl", "d",
                          TokenizeSettings())
    trip = stats["round_trip"]
    assert trip["answer_own_tokens"] == 3 and trip["answer_mismatched"] == 0 and trip["prompt_mismatched"] == 0, trip
    rows = pq.read_table(tmp_path / "t.parquet").to_pylist()
    supervised = "".join(tokenizer.decode([t for t, m in zip(r["input_ids"], r["loss_mask"], strict=True) if m])
                         for r in rows)
    assert supervised.count('"name": "a"') == 1 and supervised.count('"name": "b"') == 1
    assert "sunny-result" not in supervised


@pytest.mark.parametrize("reasoning", ["template", "think_tags", "drop"])
def test_with_tools_the_history_sent_keeps_the_reasoning_tokenize_keeps(tmp_path, reasoning):
    """Issue 57: within a tool stretch the server was sent the earlier answers' reasoning, which Qwen3's template
    renders there (vLLM hands it on as reasoning_content); with tokenize.reasoning: drop the rows render without it
    and the prompt round trip failed, blaming the template. Now the history sent keeps what the rows keep: every
    prompt the server counted is the one the tokenize stage renders. The record keeps the model's reasoning."""
    from transformers import AutoTokenizer

    if not (QWEN3_TOKENIZER / "tokenizer.json").is_file():
        pytest.skip(f"{QWEN3_TOKENIZER} is missing: run envs/test-assets.sh")
    tokenizer = AutoTokenizer.from_pretrained(QWEN3_TOKENIZER)
    with ToolSim(tokenizer=tokenizer, reasoning=True) as sim:
        run(sim, [CONTRACT], tmp_path, **tool_options([CONTRACT], None, "template", None, "d", reasoning))
    history = [m for body in sim.requests for m in body["messages"] if m["role"] == "assistant"]
    assert history and all(("reasoning" in m) == (reasoning == "template") for m in history)
    assert all(("<think>" in (m["content"] or "")) == (reasoning == "think_tags") for m in history)
    assert all("reasoning" in m for m in records(tmp_path)["p"]["messages"] if m["role"] == "assistant")
    stats = tokenize_file(tmp_path / "out.jsonl", tokenizer, tmp_path / "t.parquet", tmp_path / "rejects.jsonl", "d",
                          TokenizeSettings(reasoning=reasoning))
    trip = stats["round_trip"]
    assert trip["prompt_checked"] == 3 and trip["prompt_mismatched"] == 0, trip


def test_tokenize_reasoning_names_a_tool_sets_journal_and_params_only():
    """tokenize.reasoning shapes what a tool set's requests send, so it names its journal and enters its generate
    params where set otherwise than its default; a set without tools keeps its journal and params."""
    from draftsmith.data.datasets import generation_tool_params

    rows, plain = [T("p", ["q"], None)], [Prompt("q", ["q"])]
    assert tool_options(plain, None, "template", None, "d", "drop") == {}
    dropped = GenerationSettings(**tool_options(rows, None, "template", None, "d", "drop"))
    kept = GenerationSettings(**tool_options(rows, None, "template", None, "d", "template"))
    assert settings_key("m", kept) == settings_key("m", GenerationSettings()) != settings_key("m", dropped)
    config = {"target": {"tool_call_parser": None}, "tokenize": {"reasoning": "drop", "tool_rendering": "template"}}
    assert generation_tool_params(config, ["chat"]) == {}
    assert generation_tool_params(config, ["agent"]) == {"reasoning": "drop"}
    assert generation_tool_params({**config, "tokenize": {**config["tokenize"], "reasoning": "template"}},
                                  ["tools"]) == {}


bfcl_installed = pytest.mark.skipif(importlib.util.find_spec("bfcl_eval") is None, reason="bfcl-eval is not installed")


def bfcl_row(turns: list[str], pid: str = "multi_turn_base_0", environment: dict | None = None) -> Prompt:
    """multi_turn_base_0's tools and environment (the file system with document/final_report.pdf, a Twitter API)
    under scripted user turns."""
    from draftsmith.data import bfcl

    row = next(bfcl.rows("multi_turn_base"))
    return Prompt(pid, turns, tools=row["tools"], tool_steps=[[] for _ in turns],
                  environment=environment or row["bfcl"]["environment"])


def bfcl_harness(calls: list[str]) -> list[str]:
    """BFCL's own harness run on multi_turn_base_0's fresh instances: the texts it returns for ``calls``."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    environment = bfcl_row(["x"]).environment
    texts, _ = multi_turn_utils.execute_multi_turn_func_call(calls, environment["initial_config"],
                                                             environment["classes"], "draftsmith_test_harness", "t")
    for key in [k for k in vars(multi_turn_utils) if k.startswith("draftsmith_test_harness")]:
        del vars(multi_turn_utils)[key]
    return texts


@bfcl_installed
def test_a_bfcl_multi_turn_row_runs_the_targets_own_calls_on_its_instances(sim, tmp_path):
    """Out of the ground truth's order, in parallel, with an extra pwd and ls, and other arguments: every call runs
    on the row's own file system, its state carried across turns; errors come back as BFCL's own texts."""
    prompt = bfcl_row(["calls=pwd:+ls:a=true,mkdir:dir_name=temp,cd:folder=document,"
                       "mkdir:dir_name=temp+mv:source=final_report.pdf;destination=temp",
                       "calls=cd:folder=temp,ls:,nosuch:,cd:x=1,cd:folder=nowhere"])
    stats = run(sim, [prompt], tmp_path)
    record = records(tmp_path)["multi_turn_base_0"]
    results = [m["content"] for m in record["messages"] if m["role"] == "tool"]
    assert results[:2] == ['{"current_working_directory": "/workspace"}',
                           '{"current_directory_content": ["document", "archive"]}']
    assert results[4:6] == ["None", "{\"result\": \"'final_report.pdf' moved to 'temp/final_report.pdf'\"}"]
    assert results[6] == '{"current_working_directory": "temp"}'  # turn 2 stands where turn 1 left it
    assert results[7] == '{"current_directory_content": ["final_report.pdf"]}'
    assert results[8:10] == bfcl_harness(["nosuch()", "cd(x=1)"])
    assert results[8] == "Error during execution: name 'nosuch' is not defined"
    assert "cut" not in record and record["executed_steps"] == 9 and record["tool_calls"] == 11
    assert record["execution_errors"] == {"unknown_function": 1, "bad_arguments": 1, "error_result": 1}
    assert record["calls_expected"] == 10
    assert stats["executed_steps"] == 9 and stats["calls_made"] == 11 and stats["calls_expected"] == 10
    assert stats["execution_errors_by_reason"] == record["execution_errors"] and stats["setup_failed"] == 0
    assert stats["cuts_by_reason"] == {} and stats["fewer_calls"] == 0


@bfcl_installed
def test_a_bfcl_stretch_ends_at_bfcls_step_limit_counted(sim, tmp_path):
    prompt = bfcl_row(["calls=" + ",".join(["pwd:"] * 25), "calls=ls:"])
    stats = run(sim, [prompt], tmp_path)
    record = records(tmp_path)["multi_turn_base_0"]
    assert record["cut"] == "step_limit" and record["executed_steps"] == 20 and record["tool_calls"] == 21
    assert record["messages"][-1]["role"] == "assistant" and record["messages"][-1]["tool_calls"]
    assert stats["cuts_by_reason"] == {"step_limit": 1}


@bfcl_installed
def test_a_call_past_its_timeout_is_an_error_the_target_sees_and_the_next_call_ends_the_row(sim, tmp_path,
                                                                                          monkeypatch):
    """A call that runs long ran on the event loop and stalled every conversation; now it runs in a thread, its
    timeout comes back as an error text counted ``timeout``, the turn's later calls are not run on the abandoned
    instances, and the target's next call ends the conversation. (A call stuck in one C operation that holds the
    GIL, ``power(base=10, exponent=10**12)`` on integers, still stalls the process: a thread cannot bound it.)"""
    from draftsmith.data import bfcl

    harness = bfcl.Instances._harness

    def slow(self, calls):  # ls never returns in time; the thread it runs in is left behind
        if any(call.startswith("ls(") for call in calls):
            time.sleep(3)
        return harness(self, calls)

    monkeypatch.setattr(bfcl.Instances, "_harness", slow)
    monkeypatch.setattr(bfcl, "CALL_TIMEOUT_S", 0.2)
    begun = time.monotonic()
    stats = run(sim, [bfcl_row(["calls=pwd:+ls:+pwd:,cd:folder=document", "calls=pwd:"])], tmp_path)
    assert time.monotonic() - begun < 2.5
    record = records(tmp_path)["multi_turn_base_0"]
    results = [m["content"] for m in record["messages"] if m["role"] == "tool"]
    assert results == ['{"current_working_directory": "/workspace"}',
                       "Error during execution: the call did not finish within 0.2 s",
                       "Error during execution: not run: an earlier call of the turn timed out"]
    assert record["execution_errors"] == {"timeout": 1, "not_run": 1} and record["executed_steps"] == 1
    assert record["cut"] == "call_timeout" and record["messages"][-1]["tool_calls"]  # the call not run: no result
    assert stats["cuts_by_reason"] == {"call_timeout": 1}


@bfcl_installed
def test_a_row_whose_instances_cannot_be_set_up_is_named_and_the_others_run(sim, tmp_path, caplog):
    """Under max_error_fraction the job finishes; the row is an error (named in the log, the stats and the errors
    file), never journaled, so the next run tries it again."""
    good = bfcl_row(["calls=pwd:"])
    broken = bfcl_row(["calls=pwd:"], "multi_turn_base_9", {**good.environment, "classes": ["NoSuchAPI"]})
    with caplog.at_level("WARNING"):
        stats = run(sim, [good, broken], tmp_path, max_error_fraction=0.5)
    assert set(records(tmp_path)) == {"multi_turn_base_0"}
    assert stats["setup_failed"] == 1 and stats["setup_failed_ids"] == ["multi_turn_base_9"]
    assert stats["errors"] == 1 and stats["errors_by_class"] == {"setup_failed": 1}
    assert "multi_turn_base_9: its tool instances could not be set up (NoSuchAPI: KeyError" in caplog.text
    assert "1 rows whose tool instances could not be set up were not regenerated (errors: the next run tries them " \
           "again): multi_turn_base_9" in caplog.text
    errors = [json.loads(line) for line in (tmp_path / "errors.jsonl").read_text().splitlines()]
    assert [(e["id"], e["error_class"]) for e in errors] == [("multi_turn_base_9", "setup_failed")]
    journal = [json.loads(line) for line in (tmp_path / "journal" / "j.jsonl").read_text().splitlines()]
    assert [r["id"] for r in journal] == ["multi_turn_base_0"]


@bfcl_installed
def test_a_row_whose_instances_failed_to_set_up_regenerates_once_its_environment_sets_up(sim, tmp_path,
                                                                                         monkeypatch):
    """Nothing lost: a set-up failure counts against max_error_fraction (the job fails, its journal kept), and the
    rerun once the wheel sets the row's instances up regenerates it; the row answered before is not sent again. A
    row journaled setup_failed by the version before is sent again too."""
    from draftsmith.data import bfcl

    good, other = bfcl_row(["calls=pwd:"]), bfcl_row(["calls=ls:"], "multi_turn_base_1")
    harness, broken = bfcl.Instances._harness, {"now": True}

    def flaky(self, calls):  # the wheel fails to set up ``other``'s instances while broken
        if broken["now"] and self._environment is other.environment:
            raise ImportError("a wheel that cannot load its classes")
        return harness(self, calls)

    monkeypatch.setattr(bfcl.Instances, "_harness", flaky)
    with pytest.raises(GenerationFailed, match=r"1 of 2 prompts failed .* setup_failed"):
        run(sim, [good, other], tmp_path)
    journal = tmp_path / "journal" / "j.jsonl"
    assert [json.loads(line)["id"] for line in journal.read_text().splitlines()] == ["multi_turn_base_0"]
    with journal.open("a") as older:  # as the version before journaled it: final
        older.write(json.dumps({"format": 2, "id": "multi_turn_base_1", "prompt_hash": other.digest,
                                "status": "setup_failed", "setup_error": "ImportError", "latency_s": 0.0}) + "\n")
    broken["now"] = False
    sim.requests.clear()
    stats = run(sim, [good, other], tmp_path)
    assert stats["records"] == 2 and stats["setup_failed"] == 0 and stats["errors"] == 0
    assert [m["content"] for m in records(tmp_path)["multi_turn_base_1"]["messages"] if m["role"] == "tool"] == [
        '{"current_directory_content": ["document", "archive"]}']
    assert {b["messages"][0]["content"] for b in sim.requests} == {"calls=ls:"}  # only the row not answered


@bfcl_installed
def test_cut_still_pairs_a_bfcl_row_with_the_datasets_results_where_set(sim, tmp_path):
    prompt = bfcl_row(["calls=pwd:"])
    run(sim, [prompt], tmp_path, unmatched_calls="cut")
    assert records(tmp_path)["multi_turn_base_0"]["cut"] == "more_calls_than_results"



def test_execute_on_a_set_without_environments_is_refused_before_any_request(sim, tmp_path):
    with pytest.raises(GenerationFailed, match=r"d: generation.unmatched_calls: execute .* 1 rows with tools have "
                                               r"none \(first: p\); set cut or by_name"):
        run(sim, [T("p", ["calls=a"], [[[result("a")]]])], tmp_path, unmatched_calls="execute")
    assert not sim.requests


def test_an_openhands_trajectory_tokenizes_with_only_the_models_own_call_supervised(tmp_path):
    """Issue 58: an OpenHands trajectory's turn, its dataset's calls and results sent as structure, is a row the
    template renders with its tools, the model's call its only supervised tokens (never the dataset's action or
    its result), and the prompt the server counted is the row's."""
    from transformers import AutoTokenizer

    if not (QWEN3_TOKENIZER / "tokenizer.json").is_file():
        pytest.skip(f"{QWEN3_TOKENIZER} is missing: run envs/test-assets.sh")
    tokenizer = AutoTokenizer.from_pretrained(QWEN3_TOKENIZER)
    bash = {"type": "function", "function": {"name": "bash", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
    trajectory = Prompt("o", ["fix it calls=bash,bash,bash:command=pytest", "EXECUTION RESULT of [bash]:\nfile.py",
                              "EXECUTION RESULT of [bash]:\nsaved-result"], "sys", [bash],
                        history=["Looking.\n<function=bash>\n<parameter=command>ls</parameter>\n</function>",
                                 "<function=bash>\n<parameter=command>\nsed -i s/a/b/ file.py\n</parameter>\n"],
                        calls="openhands")
    with ToolSim(tokenizer=tokenizer) as sim:
        run(sim, [trajectory], tmp_path)
    assert [len(r["messages"]) for r in records(tmp_path).values()] == [3, 5, 7]
    settings = TokenizeSettings(max_prompt_mismatch_fraction=0.0, max_answer_mismatch_fraction=0.0)
    stats = tokenize_file(tmp_path / "out.jsonl", tokenizer, tmp_path / "t.parquet", tmp_path / "rejects.jsonl", "d",
                          settings)
    assert stats["rows"] == 3 and stats["round_trip"]["prompt_mismatched"] == 0
    for row in pq.read_table(tmp_path / "t.parquet").to_pylist():
        supervised = tokenizer.decode([t for t, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m])
        assert supervised.count('"name": "bash"') == 1 and "Looking" not in supervised and "sed -i" not in supervised
        assert "file.py" not in supervised and "saved-result" not in supervised
