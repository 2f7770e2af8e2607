"""Agent sets in the shapes they are published in (issue 58): Glaive v2, Hermes function-calling v1, xLAM /
APIGen, SWE-agent trajectories, OpenHands / SWE-Gym exports. The fixtures under tests/fixtures/agent_shapes/ are
written from each dataset's published schema, with its quirks: Glaive's single-quoted arguments, Hermes's Python
literals, xLAM's Python type names and JSON-string columns, OpenHands' calls as <function=...> text (a multi-line
value wrapped in newlines, an array value, a last call cut before </function>), contents as lists of text parts,
a result as a tool message, a tools field that is a JSON string, the in-context example in the first user turn."""

import json

import pytest

from draftsmith.config.load import validate_config
from draftsmith.core.digest import prompt_digest
from draftsmith.data.agent_shapes import python_type_schema
from draftsmith.data.datasets import Prompt, load_configured, load_prompts
from tests.conftest import REPO

FIXTURES = REPO / "tests" / "fixtures" / "agent_shapes"


def rows(shape):
    return [json.loads(line) for line in (FIXTURES / f"{shape}.jsonl").read_text().splitlines()]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def loaded(path, **kwargs):
    result = load_prompts(path, **kwargs)
    assert not result.rejects, [str(r) for r in result.rejects]
    return result.prompts


def function(name, properties, required):
    return {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


def names(prompt):
    return [t["function"]["name"] for t in prompt.tools]


def test_glaive_reads_the_functions_from_system_and_the_transcript_as_turns_calls_and_results():
    password, plain, email = loaded(FIXTURES / "glaive.jsonl")
    assert loaded(FIXTURES / "glaive.jsonl", fmt="glaive") == [password, plain, email]
    assert password.turns == ["I need a new password. Can you generate one for me?",
                              "I would like it to be 12 characters long."]
    assert password.system is None  # the functions' instructions: the template writes its own
    assert password.tools[0]["function"]["parameters"]["required"] == ["length"]
    # the call (single-quoted arguments) answered by its FUNCTION RESPONSE, in the second user turn's stretch
    assert password.tool_steps == [[], [[{"name": "generate_password", "arguments": {"length": 12},
                                              "content": '{"password": "aB3$fG7!kL9@"}'}]]]
    assert plain.tools is None and plain.tool_steps is None
    assert plain.system == "You are a helpful assistant, with no access to external functions."
    assert plain.turns == ["Can you explain the difference between a list and a tuple in Python?"]
    # two functions one after another; an apostrophe inside the single-quoted arguments
    assert names(email) == ["generate_password", "send_email"]
    assert email.tool_steps == [[[{"name": "send_email", "arguments": {"to": "bob@example.com",
                                                                      "message": "I'm running late"},
                                   "content": '{"status": "sent"}'}]]]


def test_hermes_reads_tools_calls_and_responses_and_leaves_out_the_tool_instructions():
    multi, single, parallel = loaded(FIXTURES / "hermes.jsonl", fmt="hermes")
    assert multi.turns == ["What is Apple's stock price right now?", "Thanks!"]
    assert multi.system is None and single.system is None  # never the tools twice, as text and as structure
    stock = function("get_stock_price", {"symbol": {"type": "string", "description": "The stock symbol, e.g. AAPL"}},
                     ["symbol"])
    stock["function"]["description"] = "Get the current stock price"
    assert multi.tools == [stock]  # from Python literals
    response = '{"name": "get_stock_price", "content": {"symbol": "AAPL", "price": 189.3}}'
    assert multi.tool_steps == [[[{"name": "get_stock_price", "arguments": {"symbol": "AAPL"}, "content": response}]],
                                []]
    assert single.open_end and not multi.open_end  # ends at its calls; ends at an answer
    assert names(single) == ["set_light"] and single.tool_steps == [[]]  # two calls, no results: ends at its call
    assert [r["arguments"]["room"] for r in parallel.tool_steps[0][0]] == ["kitchen", "hall"]
    assert [r["content"] for r in parallel.tool_steps[0][0]] == [
        '{"name": "set_light", "content": "kitchen on"}', '{"name": "set_light", "content": "hall on"}']


def test_hermes_tools_appear_once_under_text_rendering():
    """tokenize.tool_rendering: text writes its own <tools> block into the system prompt (as generation sends
    it): the dataset's tool instructions, left out, must not put a second one beside it."""
    from draftsmith.data.chat import text_rendering

    for prompt in loaded(FIXTURES / "hermes.jsonl", fmt="hermes"):
        messages = ([{"role": "system", "content": prompt.system}] if prompt.system else []) + \
            [{"role": "user", "content": prompt.turns[0]}]
        rendered = "".join(m["content"] for m in text_rendering(messages, prompt.tools))
        assert rendered.count("<tools>") == 1 and rendered.count(prompt.tools[0]["function"]["name"]) == 1


def test_a_sharegpt_row_with_hermes_markup_is_refused_under_auto_and_read_as_chat_when_asked():
    result = load_prompts(FIXTURES / "hermes.jsonl")
    assert not result.prompts and len(result.rejects) == 3
    assert all(r.field == "conversations" and "format: hermes" in r.reason for r in result.rejects)
    as_chat = load_prompts(FIXTURES / "hermes.jsonl", fmt="conversations")  # as read before: digests stay
    assert [r.reason for r in as_chat.rejects] == ["a tool result with no call before it"] * 2  # the call is text
    (single,) = as_chat.prompts
    row = rows("hermes")[1]
    assert single.tools is None and single.digest == prompt_digest(
        ["Turn on the kitchen and the hall lights."], row["conversations"][0]["value"])


def test_xlam_turns_python_types_into_json_schema_and_keeps_the_answers_as_calls(tmp_path):
    giveaways, largest, irrelevant = loaded(FIXTURES / "xlam.jsonl")
    assert loaded(FIXTURES / "xlam.jsonl", fmt="xlam") == [giveaways, largest, irrelevant]
    assert [p.id for p in (giveaways, largest, irrelevant)] == ["1", "2", "3"]
    assert giveaways.turns == ["Where can I find live giveaways for beta access and games?"]
    assert giveaways.tools[0]["function"]["parameters"] == {"type": "object", "properties": {"type": {
        "type": "string", "description": "The type of giveaways to retrieve (e.g., game, loot, beta).",
        "default": "game"}}, "required": []}
    invest = largest.tools[1]["function"]["parameters"]
    assert largest.tools[0]["function"]["parameters"]["properties"]["nums"]["type"] == "array"
    assert {k: v["type"] for k, v in invest["properties"].items()} == {
        "principal": "number", "rate": "number", "years": "integer", "currency": "string", "compound": "boolean",
        "meta": "object", "tags": "array"}
    assert invest["required"] == ["principal", "tags"]  # neither a default nor marked optional
    assert invest["properties"]["compound"]["default"] is True
    # the answers are the row's calls, with no results: the conversation ends at the target's call
    assert giveaways.tool_steps == largest.tool_steps == irrelevant.tool_steps == [[]]
    assert giveaways.open_end and largest.open_end and irrelevant.open_end  # ends_at_call, never a cut
    bad = rows("xlam")[0] | {"answers": json.dumps([{"arguments": {"type": "beta"}}])}
    (reject,) = load_prompts(write_jsonl(tmp_path / "bad.jsonl", [bad])).rejects
    assert (reject.field, reject.reason) == ("answers.name", "missing")


@pytest.mark.parametrize("written, schema, optional", [
    ("str", {"type": "string"}, False),
    ("List[int]", {"type": "array", "items": {"type": "integer"}}, False),
    ("List[List[float]]", {"type": "array", "items": {"type": "array", "items": {"type": "number"}}}, False),
    ("Optional[str]", {"type": "string"}, True),
    ("int, optional", {"type": "integer"}, True),
    ("Dict[str, int]", {"type": "object"}, False),
    ("Tuple[float, float]", {"type": "array"}, False),
    ("Callable[[float], float]", {}, False),  # no JSON schema word: the type is left open, the row kept
    ("integer", {"type": "integer"}, False),
])
def test_xlam_type_names(written, schema, optional):
    assert python_type_schema(written, "t") == (schema, optional)


def test_a_sweagent_trajectory_loads_with_its_own_history():
    """Issue 58: the trajectory was refused (prompt: missing, then by name). Its observations are the user turns,
    its actions the dataset's answers each later turn is asked on; the last action is the model's to give."""
    (row,) = rows("sweagent")
    for fmt in ("auto", "sweagent"):
        (prompt,) = loaded(FIXTURES / "sweagent.jsonl", fmt=fmt, id_field="instance_id")
        assert prompt.id == row["instance_id"] and prompt.system == row["trajectory"][0]["text"]
        assert prompt.turns == [row["trajectory"][1]["text"], row["trajectory"][3]["text"]]
        assert prompt.history == [row["trajectory"][2]["text"]]  # the command stays text, as written
        assert prompt.tools is None and prompt.tool_steps is None


def test_a_trajectory_is_refused_as_an_evaluation_set_and_where_its_turns_do_not_alternate(tmp_path):
    with pytest.raises(ValueError, match=r"sweagent.jsonl: row 1: a trajectory \(format: sweagent\).*evaluation "
                                         r"grid does not run trajectory sets"):
        load_prompts(FIXTURES / "sweagent.jsonl", history="refused")
    (row,) = rows("sweagent")
    twice = {**row, "trajectory": [*row["trajectory"], row["trajectory"][-1]]}
    unknown = {**row, "trajectory": [{"role": "tool", "text": "x"}]}
    result = load_prompts(write_jsonl(tmp_path / "t.jsonl", [twice, unknown]))
    assert [(r.field, r.reason.split(":")[0]) for r in result.rejects] == [
        ("trajectory[5]", "a assistant turn where the user turn was due"),
        ("trajectory[0].role", "expected one of system, user, ai")]


def test_history_dataset_keeps_a_chat_rows_answers_and_refuses_its_calls(tmp_path):
    chat = {"id": "c", "messages": [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"},
                                    {"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2"}]}
    calls = {"id": "t", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [
        {"function": {"name": "f", "arguments": "{}"}}]}, {"role": "tool", "content": "r"}],
             "tools": [{"name": "f"}]}
    silent = {"id": "s", "messages": [{"role": "user", "content": "q1"}, {"role": "assistant", "content": None},
                                      {"role": "user", "content": "q2"}]}
    result = load_prompts(write_jsonl(tmp_path / "c.jsonl", [chat, calls, silent]), history="dataset")
    assert [(p.turns, p.history) for p in result.prompts] == [(["q1", "q2"], ["a1"])]
    assert [(r.row, r.field, r.reason) for r in result.rejects] == [
        (2, "messages[1]", "a call turn where the assistant turn was due: generation.history: dataset reads "
                           "alternating user and assistant turns, from a user turn, without tool calls"),
        (3, "messages[1].content", "missing")]
    (plain,) = loaded(tmp_path / "c.jsonl", max_samples=1)
    assert plain.history is None  # unset: answered on the model's own history, as before


def test_rows_without_the_datasets_answers_keep_their_digests():
    """The digests of rows read before trajectories were (pinned): no finished journal is answered again."""
    plain = Prompt("p", ["q1", "q2"], "sys")
    assert plain.digest == "eed64601a91a17d2"
    assert Prompt("p", ["q1", "q2"], "sys", history=["a1"]).digest != plain.digest


def test_an_explicit_prompt_field_wins_over_detection(tmp_path):
    """Projects that read these sets through a prompt column before keep their prompts and digests."""
    (query,) = loaded(write_jsonl(tmp_path / "x.jsonl", rows("xlam")[:1]), prompt_field="query")
    raw_tools = json.loads(rows("xlam")[0]["tools"])
    assert query.tools == [{"type": "function", "function": raw_tools[0]}]  # as before: not turned into schema
    (chat,) = loaded(write_jsonl(tmp_path / "g.jsonl", rows("glaive")[:1]), prompt_field="chat")
    assert chat.turns == [rows("glaive")[0]["chat"]] and chat.tools is None


CALLS_NO_TOOLS = {"id": "no-tools", "conversations": [
    {"from": "human", "value": "Weather in Paris?"},
    {"from": "function_call", "value": '{"name": "get_weather", "arguments": {"city": "Paris"}}'},
    {"from": "observation", "value": "sunny"}, {"from": "gpt", "value": "Sunny."}]}
WEATHER = {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


def test_a_row_with_calls_and_no_tools_is_refused_unless_the_set_gives_them(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [CALLS_NO_TOOLS, {"id": "chat", "prompt": "hello"},
                                              rows("glaive")[0] | {"system": "SYSTEM: no functions here."}])
    result = load_prompts(path)
    assert [p.id for p in result.prompts] == ["chat"]
    assert [(r.row, r.field) for r in result.rejects] == [(1, "tools"), (3, "tools")]
    assert "datasets.<name>.tools" in result.rejects[0].reason
    given = load_prompts(path, tools=[WEATHER])
    assert not given.rejects
    assert all(p.tools == [{"type": "function", "function": WEATHER}] for p in given.prompts)
    assert given.prompts[0].tool_steps == [[[{"name": "get_weather", "arguments": {"city": "Paris"},
                                              "content": "sunny"}]]]
    assert given.prompts[1].tool_steps == [[]] and given.prompts[1].open_end  # a prompt with the set's tools
    own = loaded(FIXTURES / "xlam.jsonl", tools=[WEATHER])  # a row's own tools win
    assert names(own[0]) == ["live_giveaways_by_type"]


def test_the_sets_tools_are_a_setting_that_is_absent_unless_set(tmp_path):
    config = {"target": {"name": "t", "source": "x"}, "datasets": {"a": {"source": "a.jsonl"}},
              "evaluation": {"prompt_sets": {"b": {"source": "b.jsonl"}}}}
    assert "tools" not in validate_config(config)["datasets"]["a"]  # so not in a finished project's params
    config["datasets"]["a"] |= {"tools": [WEATHER], "format": "conversations"}
    entry = validate_config(config)["datasets"]["a"]
    write_jsonl(tmp_path / "a.jsonl", [CALLS_NO_TOOLS])
    assert load_configured(entry, tmp_path).prompts[0].tools == [{"type": "function", "function": WEATHER}]
    smk = (REPO / "rules" / "common.smk").read_text()
    assert '"tools",\n)' in smk and "if k in entry" in smk  # a source key, in params only where set


MALFORMED = [
    ("glaive", {"chat": "USER: hi\n\n\nASSISTANT: <functioncall> get_password(12) <|endoftext|>"}, "chat[1]",
     "<functioncall> is not"),
    ("glaive", {"system": "SYSTEM: functions -\n{\"name\": \"f\",}"}, "system", "function JSON not readable"),
    ("glaive", {"chat": "hello\nUSER: hi"}, "chat", "text before the first"),
    ("hermes", {"conversations": [{"from": "system", "value": "<tools>[{'name': 'f'}]</tools>"},
                                  {"from": "human", "value": "go"},
                                  {"from": "gpt", "value": "<tool_call>{name: f}</tool_call>"}]},
     "conversations[2].value", "neither JSON nor a Python literal"),
    ("hermes", {"conversations": [{"from": "system", "value": "<tools>[{'type': 'function'}]</tools>"},
                                  {"from": "human", "value": "go"}]},
     "conversations[0].value (tools[0].function)", "expected a function schema"),
    ("hermes", {"conversations": [{"from": "human", "value": "go"}, {"from": "tool", "value": "x"}]},
     "conversations[1].value", "a tool result with no call before it"),
    ("xlam", {"tools": "[{"}, "tools", "not valid JSON"),
    ("xlam", {"tools": json.dumps([{"name": "f", "parameters": {"x": "str"}}])}, "tools[0].parameters.x",
     "expected an object with a type"),
]


@pytest.mark.parametrize("shape, change, field, reason", MALFORMED)
def test_malformed_rows_of_each_shape_are_rejected_naming_the_field(shape, change, field, reason, tmp_path):
    result = load_prompts(write_jsonl(tmp_path / "p.jsonl", [rows(shape)[0] | change]), fmt=shape)
    assert [(r.row, r.field) for r in result.rejects] == [(1, field)] and reason in result.rejects[0].reason, \
        [str(r) for r in result.rejects]



def openhands_tools():
    return json.loads(rows("openhands")[1]["tools"])


def test_an_openhands_export_loads_as_a_trajectory_with_its_calls_as_text_and_its_tools():
    swegym, with_tools, nudge = loaded(FIXTURES / "openhands.jsonl", fmt="openhands")
    assert all(p.calls == "openhands" for p in (swegym, with_tools, nudge))
    # SWE-Gym's rows have no tools field: the set gives none here, so the calls stay text
    assert swegym.tools is None and len(swegym.turns) == 3 and len(swegym.history) == 2
    assert swegym.history[0].startswith("Let me look at the repository first.\n<function=execute_bash>")
    assert swegym.turns[1].startswith("EXECUTION RESULT of [execute_bash]:\nAUTHORS.md")
    assert "You have access to the following functions" in swegym.system  # as published, until generation
    # the export's own tools field (a JSON string), list-of-parts contents, a result as a tool message
    assert names(with_tools) == ["execute_bash", "str_replace_editor", "finish"]
    assert with_tools.turns[1] == "EXECUTION RESULT of [execute_bash]:\nmoto/dynamodb/responses.py:12: " \
                                  "projection_expression"
    # the set's tools for rows without their own, the export's own winning where it has them
    set_tools = [{**t, "function": {**t["function"], "description": "the set's"}} for t in openhands_tools()]
    given = loaded(FIXTURES / "openhands.jsonl", fmt="openhands", tools=set_tools)
    assert given[0].tools == set_tools and given[1].tools == with_tools.tools
    assert given[0].digest != swegym.digest  # the tools its calls are read against are part of the row


def test_openhands_calls_read_as_structure_where_the_template_renders_calls():
    from draftsmith.generation.generate import calls_as_structure, history_messages

    swegym = loaded(FIXTURES / "openhands.jsonl", fmt="openhands", tools=openhands_tools())[0]
    sent = history_messages(swegym, 2)
    assert calls_as_structure(swegym, "template") and not calls_as_structure(swegym, "text")
    assert sent[0]["content"].endswith("</IMPORTANT>")  # the functions' description left to the template
    assert sent[1]["content"].startswith("<uploaded_files>")  # the in-context example and its suffix left out
    assert sent[1]["content"].endswith("ProjectionExpression on query.")
    assert sent[2]["content"] == "Let me look at the repository first."
    assert [c["function"] for c in sent[2]["tool_calls"] + sent[4]["tool_calls"]] == [
        {"name": "execute_bash", "arguments": json.dumps({"command": "ls /workspace/getmoto__moto__4.1"})},
        {"name": "str_replace_editor", "arguments": json.dumps({
            "command": "view", "path": "/workspace/getmoto__moto__4.1/moto/dynamodb/models/table.py",
            "view_range": [1, 20]})}]  # the array typed by its schema, the multi-line value without its newlines
    assert sent[3] == {"role": "tool", "tool_call_id": sent[2]["tool_calls"][0]["id"], "name": "execute_bash",
                       "content": swegym.turns[1].removeprefix("EXECUTION RESULT of [execute_bash]:\n")}
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    # rendered as text (or without tools), the context is the export's own text
    as_text = history_messages(swegym, 2, "text")
    assert [m["content"] for m in as_text] == [swegym.system, swegym.turns[0], swegym.history[0], swegym.turns[1],
                                               swegym.history[1], swegym.turns[2]]
    # a plain answer stays text and the nudge after it a user turn
    nudge = loaded(FIXTURES / "openhands.jsonl", fmt="openhands", tools=openhands_tools())[2]
    assert [m["role"] for m in history_messages(nudge, 2)] == ["system", "user", "assistant", "user", "assistant",
                                                              "tool"]


def test_openhands_rows_are_refused_under_auto_and_where_their_calls_cannot_be_read(tmp_path):
    refused = load_prompts(FIXTURES / "openhands.jsonl").rejects
    assert [r.field for r in refused] == ["messages"] * 3 and all("format: openhands" in r.reason for r in refused)
    row = rows("openhands")[1]
    bad_value = json.loads(json.dumps(row))
    bad_value["messages"][2]["content"][0]["text"] = (
        "<function=str_replace_editor>\n<parameter=command>view</parameter>\n<parameter=path>/a</parameter>\n"
        "<parameter=view_range>first lines</parameter>\n</function>")
    unknown = json.loads(json.dumps(row).replace("<function=execute_bash>", "<function=run_shell>"))
    broken = {**row, "messages": [*row["messages"][:2], {"role": "assistant", "content": "<function=\n"},
                                  *row["messages"][3:]]}
    result = load_prompts(write_jsonl(tmp_path / "bad.jsonl", [bad_value, unknown, broken]), fmt="openhands")
    assert [(r.field, r.reason.split(":")[0].split(" (")[0]) for r in result.rejects] == [
        ("answer 1", "parameter value 'first lines' is not of its schema's type"),
        ("answer 1", "calls 'run_shell', not one of the tools"),
        ("messages[2]", "holds <function= markup that is not <function=NAME>...</function>")]


# nebius/SWE-rebench-openhands-trajectories: OpenHands with function calling, its trajectory OpenAI messages whose
# calls are tool_calls (arguments a JSON string) answered by tool messages, every message carrying every field (null
# where unused), parallel calls answered by consecutive tool messages, a last finish call that nothing answers.
OH_TRAJECTORY = FIXTURES / "openhands_trajectory.jsonl"


def test_an_openhands_trajectory_with_structured_calls_loads_on_its_own_history():
    """Issue 58: detected as sweagent by its trajectory key and refused (trajectory[0].text: missing)."""
    (row,) = rows("openhands_trajectory")
    for fmt in ("auto", "openhands"):
        (prompt,) = loaded(OH_TRAJECTORY, fmt=fmt, id_field="trajectory_id")
        assert prompt.id == row["trajectory_id"] and prompt.calls == "openhands"
        assert prompt.system == row["trajectory"][0]["content"] and prompt.tools == row["tools"]
        assert prompt.turns[0] == row["trajectory"][1]["content"]
        assert prompt.turns[1] == "EXECUTION RESULT of [execute_bash]:\nsdf_xarray\n[The command completed with " \
                                  "exit code 0.]"
        assert prompt.turns[2].count("EXECUTION RESULT of [") == 2  # the parallel calls' results, one turn
        assert prompt.turns[4] == row["trajectory"][10]["content"]  # the nudge after a plain answer
        assert len(prompt.turns) == 5 and len(prompt.history) == 4  # the finish call is the model's to give
        assert prompt.history[0] == "I'll start by exploring the repository structure.\n<function=execute_bash>\n" \
                                    "<parameter=command>ls /testbed/src</parameter>\n</function>"
        assert prompt.history[3] == row["trajectory"][9]["content"]


def test_openhands_structured_calls_go_back_as_tool_calls_and_tool_turns_where_the_template_renders_calls():
    from draftsmith.generation.generate import history_messages

    (row,) = rows("openhands_trajectory")
    (prompt,) = loaded(OH_TRAJECTORY, id_field="trajectory_id")
    sent = history_messages(prompt, 4)
    published = row["trajectory"][:11]
    assert [m["role"] for m in sent] == [m["role"] for m in published]
    for ours, theirs in zip(sent, published, strict=True):
        assert ours["content"] == (theirs["content"] or "")
        calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in ours.get("tool_calls", [])]
        assert calls == [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                         for c in theirs["tool_calls"] or []]  # typed by their schema: a number, an array
        if theirs["role"] == "tool":
            assert ours["name"] == theirs["name"]
    ids = [c["id"] for c in sent[4]["tool_calls"]]
    assert [m["tool_call_id"] for m in sent[5:7]] == ids and len(set(ids)) == 2
    # rendered as text, the context is the trajectory as OpenHands writes it for a model without function calling
    assert [m["role"] for m in history_messages(prompt, 4, "text")] == ["system"] + ["user", "assistant"] * 4 + [
        "user"]


def test_auto_tells_the_trajectories_apart_by_their_items_and_sweagent_keeps_its_digest(tmp_path):
    """A trajectory of role + content items is OpenHands', of role + text items SWE-agent's, read as before (the
    digest pinned from main: no finished journal is answered again); a row holding both stays SWE-agent's."""
    (prompt,) = loaded(FIXTURES / "sweagent.jsonl", id_field="instance_id")
    assert prompt.calls is None and prompt.digest == "34f72757b5f791dd"
    (row,) = rows("openhands_trajectory")
    both = {**row, "trajectory": [{**m, "text": m["content"]} for m in row["trajectory"]]}
    result = load_prompts(write_jsonl(tmp_path / "t.jsonl", [row, both]))
    assert [p.calls for p in result.prompts] == ["openhands"]
    assert [r.field for r in result.rejects] == ["trajectory[2].role"]  # assistant: not a SWE-agent role


def test_an_openhands_trajectory_whose_calls_cannot_be_read_back_is_refused(tmp_path):
    (row,) = rows("openhands_trajectory")
    arguments = json.loads(json.dumps(row))
    arguments["trajectory"][2]["tool_calls"][0]["function"]["arguments"] = "{'command': 'ls'}"
    markup = json.loads(json.dumps(row))
    markup["trajectory"][2]["content"] = "Calling <function=execute_bash> now."
    unanswered = json.loads(json.dumps(row))
    del unanswered["trajectory"][3]
    value = json.loads(json.dumps(row))
    value["trajectory"][2]["tool_calls"][0]["function"]["arguments"] = json.dumps({"command": "echo '</parameter>'"})
    results_only = {**row, "trajectory": [row["trajectory"][5], row["trajectory"][6]]}  # read, not crashed on
    result = load_prompts(write_jsonl(tmp_path / "bad.jsonl", [arguments, markup, value, unanswered, results_only]))
    assert [p.turns[0].count("EXECUTION RESULT") for p in result.prompts] == [2]
    assert [(r.field, r.reason.split(":")[0]) for r in result.rejects] == [
        ("trajectory[2].tool_calls[0].function.arguments", "not valid JSON"),
        ("trajectory[2]", "its content holds <function= markup besides its tool_calls"),
        ("trajectory[2].tool_calls", "a call whose values hold OpenHands markup (</parameter>, </function>)"),
        ("trajectory[3]", "a assistant turn where the user turn was due")]


def test_an_openhands_trajectory_over_the_prompt_limit_is_refused_naming_its_trajectory():
    result = load_prompts(OH_TRAJECTORY, max_prompt_chars=100)
    assert [(r.field, r.reason.split(" is ")[0]) for r in result.rejects] == [("trajectory", "prompt")]
