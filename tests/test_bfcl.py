"""BFCL v4 tool-call prompt sets from the bfcl-eval wheel (``bfcl:<category>`` sources) and the ``workload``
label of prompt sets."""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import re
from pathlib import Path

import pytest

from draftsmith.config.load import ConfigError, load_layers, validate_config
from draftsmith.config.target import resolve
from draftsmith.data import bfcl
from draftsmith.data.datasets import load_prompts, read_prompts, resolve_source, write_prompts
from draftsmith.evaluation.measure import methods
from draftsmith.ops import preflight
from tests.conftest import REPO

installed = pytest.mark.skipif(importlib.util.find_spec("bfcl_eval") is None,
                               reason="bfcl-eval is not installed (envs/setup.sh installs it with --no-deps)")
OPENAI_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
BFCL_TYPES = {"dict", "float", "tuple", "any"}


def types_in(schema: dict) -> set[str]:
    """Every ``type`` value in a schema, at any depth."""
    found = {schema["type"]} if "type" in schema else set()
    for sub in (*schema.get("properties", {}).values(), schema.get("items"), schema.get("additionalProperties")):
        if isinstance(sub, dict):
            found |= types_in(sub)
    return found


def test_a_function_doc_becomes_an_openai_tool_with_json_schema_types():
    doc = {"name": "math.factorial", "description": "n!", "parameters": {"type": "dict", "required": ["n"],
                                                                         "properties": {
        "n": {"type": "integer", "description": "the number"},
        "scale": {"type": "float", "optional": True, "default": 1.0},
        "point": {"type": "tuple", "items": {"type": "float"}},
        "anything": {"type": "any", "description": "no constraint"},
        "nested": {"type": "array", "items": {"type": "dict", "properties": {"k": {"type": "dict", "properties": {
            "v": {"type": "float"}}}}}}}},
        "response": {"type": "dict", "properties": {"result": {"type": "integer"}}}}
    tool = bfcl.to_json_schema(doc)
    assert tool["type"] == "function" and tool["function"]["name"] == "math_factorial"
    params = tool["function"]["parameters"]
    assert params["type"] == "object" and params["required"] == ["n"]
    props = params["properties"]
    assert props["scale"] == {"type": "number", "default": 1.0}  # BFCL's "optional" is not JSON schema
    assert props["point"] == {"type": "array", "items": {"type": "number"}}
    assert props["anything"] == {"description": "no constraint"}
    assert props["nested"]["items"]["properties"]["k"] == {"type": "object", "properties": {"v": {"type": "number"}}}
    assert "response" not in tool["function"]


def test_an_unknown_type_or_a_name_collision_is_an_error_naming_the_row_and_function():
    with pytest.raises(bfcl.BfclError, match=r"simple_java_3: function 'f': parameters.properties.m.type: "
                                             r"unknown type 'HashMap'"):
        bfcl.tools_for("simple_java_3", [{"name": "f", "parameters": {"type": "dict", "properties": {
            "m": {"type": "HashMap"}}}}])
    with pytest.raises(bfcl.BfclError, match=r"row_7: function names 'a.b' and 'a_b' both become tool name 'a_b'"):
        bfcl.tools_for("row_7", [{"name": "a.b"}, {"name": "a_b"}])
    tools, names = bfcl.tools_for("row_8", [{"name": "spotify.play"}, {"name": "stop"}])
    assert [t["function"]["name"] for t in tools] == ["spotify_play", "stop"]
    assert names == {"spotify_play": "spotify.play", "stop": "stop"}  # calls map back to BFCL's names


@installed
@pytest.mark.parametrize(("category", "count"), [("simple_python", 400), ("multiple", 200), ("parallel", 200),
                                                 ("parallel_multiple", 200)])
def test_every_single_turn_row_has_its_tools_in_openai_shape(category, count):
    rows = list(bfcl.rows(category))
    assert len(rows) == count
    for row in rows:
        assert row["tools"] and [m["role"] for m in row["messages"]][-1] == "user", row["id"]
        for tool in row["tools"]:
            assert OPENAI_NAME.match(tool["function"]["name"]), row["id"]
            assert not types_in(tool["function"]["parameters"]) & BFCL_TYPES, row["id"]
        assert row["bfcl"]["executed"] is None
    factorial = next(r for r in rows if r["id"] == "simple_python_1") if category == "simple_python" else None
    if factorial:
        assert factorial["bfcl"]["tool_names"] == {"math_factorial": "math.factorial"}


@installed
def test_multi_turn_rows_hold_the_ground_truth_calls_and_their_real_results():
    rows = list(bfcl.rows("multi_turn_base"))
    assert len(rows) == 200 and all(r["bfcl"]["executed"] for r in rows), [r["bfcl"]["note"] for r in rows][:3]
    first = rows[0]["messages"]
    assert [m["role"] for m in first[:8]] == ["user", "assistant", "tool", "assistant", "tool", "assistant", "tool",
                                              "user"]
    call = first[5]["tool_calls"][0]
    assert call["id"] == "call_2" and call["function"]["name"] == "mv"
    assert json.loads(call["function"]["arguments"]) == {"source": "final_report.pdf", "destination": "temp"}
    assert first[6] == {"role": "tool", "tool_call_id": "call_2",
                        "content": '{"result": "\'final_report.pdf\' moved to \'temp/final_report.pdf\'"}'}
    # the file system's state carries across turns: turn 2 greps the file moved in turn 1
    grep = next(m for m in first if m["role"] == "tool" and "matching_lines" in m["content"])
    assert "budget analysis" in grep["content"]
    positional = next(m for m in first if m.get("tool_calls") and m["tool_calls"][0]["function"]["name"] == "sort")
    assert json.loads(positional["tool_calls"][0]["function"]["arguments"]) == {"file_name": "final_report.pdf"}


@installed
def test_a_multi_turn_row_whose_calls_cannot_run_keeps_its_user_turns_with_a_note(monkeypatch):
    def broken(*_args):
        raise ImportError("no module named mpmath")

    monkeypatch.setattr(bfcl, "_instances", broken)
    rows = list(bfcl.rows("multi_turn_base"))
    assert not any(r["bfcl"]["executed"] for r in rows)
    assert {m["role"] for r in rows for m in r["messages"]} == {"user"} and all(r["tools"] for r in rows)
    assert rows[0]["bfcl"]["note"] == ("ground truth not executed (ImportError: no module named mpmath); "
                                       "user turns only")


@installed
def test_a_bfcl_source_loads_as_prompts_with_tools_and_tool_results():
    path = resolve_source("bfcl:multi_turn_base", Path("/elsewhere"))
    assert str(path) == "bfcl:multi_turn_base"
    loaded = load_prompts(path, max_samples=5)
    assert not loaded.rejects and len(loaded.prompts) == 5
    first = loaded.prompts[0]
    assert first.id == "multi_turn_base_0" and len(first.turns) == 4 and first.tools
    assert [len(stretch) for stretch in first.tool_steps] == [3, 2, 1, 4]  # one step per ground-truth call
    assert first.tool_steps[0][0] == [{"name": "cd", "arguments": {"folder": "document"},
                                       "content": '{"current_working_directory": "document"}'}]
    assert first.open_end  # it stops at its last result: a call beyond it ends the conversation, no cut
    simple = load_prompts(resolve_source("bfcl:simple_python", Path(".")))
    assert len(simple.prompts) == 400 and all(p.tools and p.open_end for p in simple.prompts)


@installed
def test_a_multi_turn_prompt_carries_its_environment_which_keys_its_digest(tmp_path):
    """What BFCL needs to set up the row's own instances travels with the prompt, through the prompts file, and
    names the row's content: a row regenerated before it held none, so it is regenerated once, live."""
    first = load_prompts(resolve_source("bfcl:multi_turn_base", Path(".")), max_samples=1).prompts[0]
    environment = first.environment
    assert environment["classes"] == ["TwitterAPI", "GorillaFileSystem"] and not environment["long_context"]
    assert "GorillaFileSystem" in environment["initial_config"] and environment["tool_names"] == {}
    assert environment["ground_truth"][0] == ["cd(folder='document')", "mkdir(dir_name='temp')",
                                              "mv(source='final_report.pdf', destination='temp')"]
    assert bfcl.expected_calls(environment) == 10
    assert first.digest != dataclasses.replace(first, environment=None).digest
    write_prompts([first], tmp_path / "p.jsonl")
    assert read_prompts(tmp_path / "p.jsonl") == [first]
    long = next(bfcl.rows("multi_turn_long_context"))
    assert long["bfcl"]["environment"]["long_context"]
    simple = load_prompts(resolve_source("bfcl:simple_python", Path(".")), max_samples=1).prompts[0]
    assert simple.environment is None


@installed
def test_an_argument_name_that_is_not_an_identifier_never_reaches_bfcls_eval(tmp_path):
    """The harness ``eval``-s the call as text: an argument name is written into it as the target wrote it, so a
    name holding code would run that code on the host. Such a name is a bad argument, and nothing runs."""
    instances = bfcl.Instances(next(bfcl.rows("multi_turn_base"))["bfcl"]["environment"])
    marker = tmp_path / "ran"
    try:
        for name in (f"folder=open({str(marker)!r}, 'w') and 'x',y", "folder name", "lambda", ""):
            text, why = instances.run({"id": "1", "function": {"name": "cd", "arguments": {name: "document"}}})
            assert why == "bad_arguments" and text.startswith(bfcl.EXECUTION_ERROR), name
        assert not marker.exists()
        assert instances.run({"id": "2", "function": {"name": "cd", "arguments": {"folder": "document"}}})[1] is None
    finally:
        instances.close()


def test_an_unknown_category_or_a_missing_package_is_a_clear_error(monkeypatch):
    with pytest.raises(ValueError, match=r"bfcl:simple: unknown category \(known: simple_python, multiple, "):
        list(bfcl.rows("simple"))
    import importlib.resources

    def absent(_name):
        raise ModuleNotFoundError("No module named 'bfcl_eval'")

    monkeypatch.setattr(importlib.resources, "files", absent)
    with pytest.raises(ValueError, match=r"bfcl:parallel: the bfcl-eval package is not installed \(envs/setup.sh"):
        list(bfcl.rows("parallel"))


@installed
def test_the_preflight_names_a_bad_bfcl_source_and_needs_no_file_for_a_good_one():
    cfg = validate_config(load_layers([REPO / "config" / "config.yaml"], {"evaluation": {"prompt_sets": {
        "calls": {"source": "bfcl:simple_python", "workload": "tools"},
        "typo": {"source": "bfcl:simple_pyton", "workload": "tools"}}}}))
    found = preflight.problems(cfg, resolve(cfg["target"], REPO), REPO, None)
    known = ", ".join(bfcl.CATEGORIES)
    assert [f for f in found if "bfcl" in f] == [
        f"evaluation.prompt_sets.typo.source: bfcl:simple_pyton: unknown category (known: {known})"]
    assert preflight.local_source("bfcl:simple_python", REPO) is None  # no job input file to wait for


@installed
def test_the_preflight_names_a_tool_set_the_grid_could_not_measure_before_any_work():
    """An evaluation set with tools labelled chat (its tool settings would enter no measurement's params), or sent to
    vLLM without a parser (a 400 on every request, found after training before): named while the DAG is built."""
    def found(sets: dict, more: dict | None = None) -> list[str]:
        cfg = validate_config(load_layers([REPO / "config" / "config.yaml"], {"evaluation": {"prompt_sets": sets},
                                                                              **(more or {})}))
        return [f for f in preflight.problems(cfg, resolve(cfg["target"], REPO), REPO, None) if "calls" in f]

    assert found({"calls": {"source": "bfcl:simple_python"}})[0].startswith(
        "evaluation.prompt_sets.calls: 400 of its 400 prompts have tools but its workload is 'chat'")
    assert "set target.tool_call_parser" in found({"calls": {"source": "bfcl:simple_python", "workload": "tools"}})[0]
    assert found({"calls": {"source": "bfcl:simple_python", "workload": "tools"}},
                 {"target": {"tool_call_parser": "hermes"}}) == []
    assert found({"calls": {"source": "bfcl:simple_python", "workload": "tools"}},
                 {"tokenize": {"tool_rendering": "text"}}) == []


MINIMAL = {"target": {"name": "t", "source": "x"}, "datasets": {"a": {"source": "a.jsonl"}},
           "evaluation": {"prompt_sets": {"b": {"source": "b.jsonl"}}}}


def test_a_prompt_set_carries_its_workload_chat_by_default():
    cfg = validate_config(copy.deepcopy(MINIMAL))
    assert cfg["datasets"]["a"]["workload"] == "chat" and cfg["evaluation"]["prompt_sets"]["b"]["workload"] == "chat"
    bad = copy.deepcopy(MINIMAL)
    bad["evaluation"]["prompt_sets"]["b"]["workload"] = "agents"
    with pytest.raises(ConfigError, match="workload"):
        validate_config(bad)
    demo = validate_config(load_layers([REPO / "config" / "config.yaml"], {}))
    assert demo["evaluation"]["prompt_sets"]["humaneval"]["workload"] == "code"
    assert demo["datasets"]["humaneval"]["workload"] == "code"


def test_a_bfcl_multi_turn_evaluation_set_is_measured_again_once_and_no_other_set_is():
    """Its calls now run live on the grid's loop: every method's cells and the shared baseline are measured again
    once, so that no speed-up divides a live window by a baseline measured on the old, cut loop."""
    sets = {"b": {"source": "b.jsonl"}, "mt": {"source": "bfcl:multi_turn_base", "workload": "agent"},
            "simple": {"source": "bfcl:simple_python", "workload": "tools"}}
    cfg = validate_config({**copy.deepcopy(MINIMAL), "evaluation": {"prompt_sets": sets}})
    evaluation = cfg["evaluation"]
    for settings in (methods.grid_settings(evaluation), methods.measurement_settings("ngram", evaluation)):
        assert settings["prompt_sets"]["mt"]["environment_rows"] == 1
        assert settings["prompt_sets"]["b"] == {k: v for k, v in cfg["evaluation"]["prompt_sets"]["b"].items()
                                                if k != "workload"}
        assert "environment_rows" not in settings["prompt_sets"]["simple"]


def test_relabelling_a_set_remeasures_nothing():
    cfg = validate_config(copy.deepcopy(MINIMAL))
    relabelled = copy.deepcopy(cfg)
    relabelled["evaluation"]["prompt_sets"]["b"]["workload"] = "agent"
    for method in ("eagle3", "ngram", "suffix"):
        assert (methods.measurement_settings(method, relabelled["evaluation"])
                == methods.measurement_settings(method, cfg["evaluation"]))
    assert methods.grid_settings(cfg["evaluation"])["prompt_sets"]["b"]["source"] == "b.jsonl"
