"""Measured per workload (issue 52, items 4 and 5): prompt sets with tools are measured with their tools and
the target's calls counted, the recipe is ranked per workload beside the pooled one, a set the target made no
calls on is named, and the report's data table shows what regeneration did with tools."""

import asyncio
import importlib.util
import json

import pytest
from aiohttp import web

from draftsmith.data.datasets import Prompt
from draftsmith.evaluation.decide import pick
from draftsmith.evaluation.measure import evaluate as ev
from draftsmith.evaluation.render.model_card import NO_TOOL_CALLS, card
from draftsmith.evaluation.render.report import Inputs
from tests import grid
from tests.sim.tool_server import ToolSim
from tests.test_generate_tools import bfcl_row
from tests.test_report import GATE, GENERATION, MERGE, NGRAM, PROMPTS, TRAINING, VOCAB, card_inputs, report

TOOLS = [{"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}
         for name in ("weather", "lookup")]


class MeteredToolSim(ToolSim):
    """The tool-calling sim with vLLM's /metrics: the tokens it answered (no running gauge)."""

    generated = 0

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        response = await super()._chat(request)
        self.generated += json.loads(response.body)["usage"]["completion_tokens"]
        return response

    async def _metrics(self, _request: web.Request) -> web.Response:
        return web.Response(text=f"# TYPE vllm:generation_tokens counter\nvllm:generation_tokens_total "
                                 f"{self.generated}\n")

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]


def test_a_set_with_tools_is_sent_them_its_calls_answered_with_the_datasets_results_and_counted(monkeypatch):
    """A prompt with tools sends them with tool_choice auto on every request; a call with a result in the dataset
    gets it and the model is asked again; a call with none ends the prompt (its second turn never sent); a prompt
    without tools is sent none. The run counts the calls and the requests that carried tools."""
    monkeypatch.setattr(ev, "MIN_READINGS", 0)  # the set sent once, no rounds added to read the engine
    prompts = [Prompt("paired", ["calls=weather"], tools=TOOLS, tool_steps=[[[{"name": "weather",
                                                                               "content": "sunny"}]]]),
               Prompt("unpaired", ["calls=lookup", "and then?"], tools=TOOLS),
               Prompt("plain", ["hello"])]
    with MeteredToolSim() as sim:
        run, _, _ = asyncio.run(ev.run_set(sim.base_url, "m", prompts, {"max_tokens": 8}, 1))
        sent = sim.requests
    assert [bool(b.get("tools")) for b in sent] == [True, True, True, False], sent
    assert all(b["tool_choice"] == "auto" for b in sent if b.get("tools"))
    answered = sent[1]["messages"]
    assert answered[1]["tool_calls"][0]["function"]["name"] == "weather"
    assert answered[2] == {"role": "tool", "tool_call_id": "call_0_0", "name": "weather", "content": "sunny"}
    assert not any(m["content"] == "and then?" for b in sent for m in b["messages"])
    assert (run.sent, run.tool_calls, run.requests_with_tools) == (4, 2, 3)
    assert run.as_dict()["tool_calls"] == 2 and run.as_dict()["requests_with_tools"] == 3


def test_a_set_with_tools_reaches_a_target_that_reads_them_as_text_as_generation_sent_them(monkeypatch):
    """tokenize.tool_rendering text (a template that ignores tools): the grid sends the tools and calls as the text
    generation trained on, no tools field, and reads the model's calls back from its answer."""
    monkeypatch.setattr(ev, "MIN_READINGS", 0)
    prompts = [Prompt("paired", ["calls=weather"], tools=TOOLS, tool_steps=[[[{"name": "weather",
                                                                               "content": "sunny"}]]])]
    with MeteredToolSim(text=True) as sim:
        run, _, _ = asyncio.run(ev.run_set(sim.base_url, "m", prompts, {"max_tokens": 8}, 1, tool_rendering="text"))
        sent = sim.requests
    assert len(sent) == 4 and not any("tools" in b for b in sent), sent  # the set sent twice (two rounds)
    assert "<tools>" in sent[0]["messages"][0]["content"]  # the tools in the system prompt, as text
    assert "<tool_response>" in sent[1]["messages"][-1]["content"] and "sunny" in sent[1]["messages"][-1]["content"]
    assert run.tool_calls == 2


@pytest.mark.parametrize("reasoning", ["drop", "think_tags"])
def test_the_grid_sends_a_tool_sets_history_with_the_reasoning_tokenize_keeps_as_generation_does(monkeypatch,
                                                                                                 reasoning):
    """Issue 57, item 5: a tool set's history reaches the server with the reasoning tokenize.reasoning keeps (drop:
    none; think_tags: inline), as generation sent it; a set without tools is sent its history as before."""
    monkeypatch.setattr(ev, "MIN_READINGS", 0)
    tools = [Prompt("paired", ["calls=weather"], tools=TOOLS, tool_steps=[[[{"name": "weather",
                                                                             "content": "sunny"}]]])]
    with MeteredToolSim(reasoning=True) as sim:
        asyncio.run(ev.run_set(sim.base_url, "m", tools, {"max_tokens": 8}, 1, rounds=1, reasoning=reasoning))
        asyncio.run(ev.run_set(sim.base_url, "m", [Prompt("plain", ["hi", "more"])], {"max_tokens": 8}, 1,
                               rounds=1, reasoning=reasoning))
        sent = sim.requests
    tool_history, plain_history = ([m for b in sent if bool(b.get("tools")) == with_tools for m in b["messages"]
                                    if m["role"] == "assistant"] for with_tools in (True, False))
    assert tool_history and not any("reasoning" in m for m in tool_history), tool_history
    assert all(("<think>" in (m["content"] or "")) == (reasoning == "think_tags") for m in tool_history)
    assert plain_history and all("reasoning" in m for m in plain_history), plain_history


def test_tokenize_reasoning_enters_the_grids_params_only_where_set_and_a_set_is_a_tool_workload():
    """The grid's params carry tokenize.reasoning as generate's do: where a set is a tool workload and the setting
    is not its default, so a finished project measures nothing again."""
    from draftsmith.data.datasets import evaluation_tool_params

    def config(reasoning: str, workloads: list[str]) -> dict:
        return {"target": {"tool_call_parser": None},
                "tokenize": {"reasoning": reasoning, "tool_rendering": "template"},
                "evaluation": {"prompt_sets": {f"s{i}": {"workload": w} for i, w in enumerate(workloads)}}}

    assert evaluation_tool_params(config("drop", ["chat", "agent"])) == {"reasoning": "drop"}
    assert evaluation_tool_params(config("drop", ["chat", "code"])) == {}
    assert evaluation_tool_params(config("template", ["agent"])) == {}


def test_the_target_alone_and_every_cell_are_measured_with_the_grids_reasoning(monkeypatch, tmp_path):
    """tokenize.reasoning reaches every measurement of the grid (the target alone and each cell), read from the
    tokenize section as tool_rendering is."""
    from contextlib import nullcontext
    from types import SimpleNamespace

    seen = []
    monkeypatch.setattr(ev, "warm_up", lambda *args: None)
    monkeypatch.setattr(ev, "prompt_sets", lambda evaluation, base_dir: {"s": [Prompt("a", ["hi"], tools=TOOLS)]})
    monkeypatch.setattr(ev, "runs_at", lambda *args, **kw: seen.append((kw["tool_rendering"], kw["reasoning"])) or [])
    evaluation = {"temperatures": [0.0], "max_tokens": 8, "concurrency": [1], "engine": "vllm"}
    grid = ev.grid_of(evaluation, {"tool_rendering": "text", "reasoning": "drop"}, tmp_path)
    server = lambda: nullcontext(SimpleNamespace(base_url="http://x/v1"))  # noqa: E731
    ev.measure_cells(grid, "m", ev.measure_baseline(grid, "m", server)["baseline"], {("ngram", 2): server})
    assert seen == [("text", "drop"), ("text", "drop")]


def with_sets(evaluation: dict, tokens_per_step: dict[str, float]) -> dict:
    """``evaluation`` with each set's runs at its own tokens per step (and speed-up), in every cell."""
    for cell in evaluation["cells"]:
        for run in cell["runs"]:
            value = tokens_per_step.get(run["set"], run["acceptance"]["tokens_per_step"])
            run["acceptance"]["tokens_per_step"] = run["acceptance"]["tau_pooled"] = value
            run["speedup"] = value
    return evaluation


SETS = (("chat_set", 0.0), ("agent_set", 0.0))
WORKLOADS = {"chat_set": "chat", "agent_set": "agent"}


def evaluations() -> dict:
    """EAGLE-3 the same on both sets; n-gram poor on chat and far ahead on the agent set, whose context repeats:
    pooled, EAGLE-3 is best; on agent traffic, n-gram."""
    return {"eagle3": with_sets(grid.evaluation("eagle3", {(3, 2): (1.5, 1.5)}, sets=SETS), {}),
            "ngram": with_sets(grid.evaluation("ngram", {(3, 2): (1.2, 1.2)}, trained=False, sets=SETS),
                               {"chat_set": 1.0, "agent_set": 1.8})}


def results(evaluations: dict) -> dict:
    rows = [pick.summary(f, e, grid.training(), 3 * 2**20, "tau", 2) for f, e in evaluations.items() if e["trained"]]
    chosen, why = pick.choose(rows, "tau", 2)
    return pick.results(evaluations, rows, chosen, why, [2], "tau", 2, NGRAM)


def test_the_recipe_is_ranked_per_workload_and_differs_from_the_pooled_one():
    measured = evaluations()
    pooled = pick.serving(measured, [2], "tau")[0]
    by_workload = pick.serving_by_workload(measured, [2], "tau", WORKLOADS)
    assert pooled["best"]["method"] == "eagle3"
    assert by_workload["agent"][0]["best"]["method"] == "ngram"
    assert by_workload["agent"][0]["best"]["tokens_per_step"] == pytest.approx(1.8)
    assert by_workload["chat"][0]["best"]["method"] == "eagle3"
    assert by_workload["agent"][0]["best_trained"]["tokens_per_step"] == pytest.approx(1.5)
    # one workload: the pooled ranking is the only one
    assert pick.serving_by_workload(measured, [2], "tau", {"chat_set": "chat", "agent_set": "chat"}) == {}
    assert "workloads" not in results(measured)  # a label: the pick, and the schedule served after it, never read it


def report_inputs(results: dict, **overrides) -> Inputs:
    return Inputs(**{"results": results, "generation": GENERATION, "prompts": PROMPTS, "merge": MERGE, "vocab": VOCAB,
                     "training": TRAINING, "gate": GATE, "workloads": WORKLOADS, **overrides})


def labelled(results: dict, **overrides):
    """The card's inputs with the evaluation sets' workloads, as the model_card rule passes them."""
    return card_inputs(results, **{"workloads": WORKLOADS, **overrides})


def test_the_card_and_the_report_give_the_recipe_per_workload_beside_the_pooled_one(tmp_path):
    written = results(evaluations())
    for text in (card(labelled(written)), report(tmp_path, report_inputs(written))):
        section = text.split("## Recipe per workload")[1].split("\n## ")[0]
        assert "### agent (agent_set)" in section and "### chat (chat_set)" in section
        agent = section.split("### agent")[1].split("###")[0]
        row = next(line for line in agent.splitlines() if line.startswith("| 2 |"))
        # best n-gram; best trained EAGLE-3; best training-free n-gram; the pooled best EAGLE-3
        assert row.count("n-gram") == 2 and row.count("EAGLE-3") == 2 and "1.800 tok/step" in row, row
    assert "Recipe per workload" not in card(card_inputs(written))  # no labels: one workload, pooled alone
    # the card's first screen gives agent traffic its own command, after the pooled one; chat's is the pooled one
    screen = card(labelled(written)).split("## What to serve")[1].split("\n## ")[0]
    agent = screen.index("For agent traffic (agent_set) alone, n-gram ranked first: 3 draft tokens")
    assert screen.index('"method": "eagle3"') < agent < screen.index('"method": "ngram"')
    assert "For chat traffic" not in screen


def with_tool_counts(evaluation: dict, counts: dict[str, tuple[int, int]]) -> dict:
    """Every run of ``evaluation`` (baseline and cells) with its set's (requests with tools, tool calls)."""
    runs = [r for c in evaluation["cells"] for r in c["runs"]] + [r for p in evaluation["baseline"] for r in p["runs"]]
    for run in runs:
        run["requests_with_tools"], run["tool_calls"] = counts.get(run["set"], (0, 0))
    return evaluation


def test_each_tool_set_reports_its_calls_and_one_with_none_is_named_beside_its_figures(tmp_path):
    counts = {"chat_set": (0, 0), "agent_set": (4, 0)}
    measured = {m: with_tool_counts(e, counts) for m, e in evaluations().items()}
    # two methods, each a cell run and a baseline run of the set
    assert pick.tool_use(measured) == {"agent_set": {"requests_with_tools": 16, "tool_calls": 0}}
    written = results(measured)
    for text in (card(labelled(written)), report(tmp_path, report_inputs(written))):
        section = text.split("## Tool calls")[1].split("\n## ")[0]
        assert f"- agent_set (agent): 0 tool calls in 16 requests with tools; **{NO_TOOL_CALLS}**" in section
        assert "chat_set" not in section
    assert "| agent_set (no tool calls: see below) | 3 |" in card(labelled(written))
    calling = results({m: with_tool_counts(e, {"agent_set": (4, 3)}) for m, e in evaluations().items()})
    text = card(labelled(calling))
    assert "- agent_set (agent): 12 tool calls in 16 requests with tools" in text and NO_TOOL_CALLS not in text
    shared = {m: {**e, "baseline_shared": True} for m, e in measured.items()}  # one baseline, counted once
    assert pick.tool_use(shared)["agent_set"]["requests_with_tools"] == 12


def test_the_reports_data_table_shows_what_regeneration_did_with_tools(tmp_path):
    generation = {**GENERATION, "glaive": {**GENERATION["everyday"], "rows_with_tools": 10, "tool_calls": 14,
                                           "cuts_by_reason": {"other_function": 2, "parallel_calls": 1},
                                           "fewer_calls": 4, "tool_call_token_source": {"template": 10},
                                           "ends_at_call": 5, "results_by_name": 2, "unparsed_call_markup": 1,
                                           "ends_at_context": 3, "dropped_context": 1}}
    tokenized = {"glaive": {"tools": {"rows_with_tools": 10, "tool_calls": 14, "tool_call_tokens": 812,
                                      "tool_result_tokens_supervised": 0, "per_turn_rerendered": 2}}}
    text = report(tmp_path, report_inputs(results(evaluations()), generation=generation, tokenized=tokenized))
    section = text.split("## Tool-call data")[1].split("\n## ")[0]
    assert ("| glaive | 10 | 14 | 3 (30%: other function 2, parallel calls 1) | 5 | 4 | 2 | 812 | 0 | "
            "the template's rendering (10) |") in section
    generated = text.split("## Response generation")[1].split("\n## ")[0]
    assert "| 3 (1) |" in generated and "| everyday |" in generated  # ended at the context (dropped)
    assert "the turns after them are semi-on-policy" in section and "(glaive: 1): check target.tool_call_parser" \
        in section
    assert "A hosted API returns text: the calls' tokens are the template's rendering" in section
    assert "one row per turn though the layout is whole (glaive: 2)" in section
    assert "| everyday |" not in section
    assert "Tool-call data" not in report(tmp_path, report_inputs(results(evaluations())))


def test_a_grid_with_tool_sets_serves_the_target_with_its_tool_call_parser(monkeypatch):
    """vLLM answers tool_choice auto with a 400 unless its server parses tool calls: a grid with a tool set starts
    every server with the target's parser, refuses to start without one (naming the set), and adds none where no
    set has tools."""
    from draftsmith.generation.server import ServerSpec

    checked = []
    monkeypatch.setattr(ev, "check_tool_call_parser", lambda engine, name, args: checked.append((engine, name)))
    server_cfg = {"extra_args": []}
    sets = {"everyday": [Prompt("a", ["hi"])], "bfcl_simple": [Prompt("b", ["call"], tools=TOOLS)]}
    def grid(chosen: dict, rendering: str = "template") -> ev.Grid:
        return ev.Grid(chosen, [0.0], 32, [1], False, "vllm", rendering)

    assert ev.tool_call_parser(grid({"everyday": sets["everyday"]}), "hermes", server_cfg) is None
    with pytest.raises(ValueError, match=r"evaluation.prompt_sets.bfcl_simple: .* set target.tool_call_parser"):
        ev.tool_call_parser(grid(sets), None, server_cfg)
    assert ev.tool_call_parser(grid(sets, "text"), None, server_cfg) is None  # tools as text: no parser reads them
    assert ev.tool_call_parser(grid(sets), "hermes", server_cfg) == "hermes" and checked == [("vllm", "hermes")]
    command = ev.for_measurement(ServerSpec(model="m"), "hermes").command(8000)
    assert "--enable-auto-tool-choice" in command and command[command.index("--tool-call-parser") + 1] == "hermes"
    assert "--tool-call-parser" not in ev.for_measurement(ServerSpec(model="m")).command(8000)


def test_the_training_free_page_ranks_its_methods_against_the_target_alone(tmp_path):
    """results/evaluation/training_free.md (./run.sh results/evaluation/training_free.md, before any data run):
    per concurrency the best training-free setting against plain serving, and every cell measured."""
    from draftsmith.evaluation.render.report import training_free_markdown

    measured = {"ngram": grid.evaluation("ngram", {(3, 2): (1.2, 1.4)}, trained=False),
                "suffix": grid.evaluation("suffix", {(3, 2): (1.1, 1.6)}, trained=False)}
    page = training_free_markdown(measured, pick.serving(measured, [2], "tau"), "tau")
    assert page.startswith("# Training-free speculation on this target")
    recipe = page.split("## Serving recipe")[1].split("\n## ")[0]
    assert "suffix" in recipe.lower() and "1.600" in recipe, recipe


@pytest.mark.skipif(importlib.util.find_spec("bfcl_eval") is None, reason="bfcl-eval is not installed")
def test_the_grid_runs_a_bfcl_row_live_on_generations_loop(monkeypatch):
    """The grid drives generation's conversation loop: a BFCL multi-turn row's calls run on its own instances (the
    second turn's prompt holds the file system's answers), where the grid's own loop would have ended it unpaired."""
    monkeypatch.setattr(ev, "MIN_READINGS", 0)
    prompt = bfcl_row(["calls=cd:folder=document,ls:", "calls=pwd:"])
    with MeteredToolSim() as sim:
        run, _, _ = asyncio.run(ev.run_set(sim.base_url, "m", [prompt], {"max_tokens": 8}, 1, rounds=1))
        sent = sim.requests
    assert [m["content"] for m in sent[-1]["messages"] if m["role"] == "tool"] == [
        '{"current_working_directory": "document"}',
        '{"current_directory_content": ["final_report.pdf", "previous_report.pdf"]}',
        '{"current_working_directory": "/workspace/document"}']
    assert run.tool_calls == 3 and run.requests_with_tools == len(sent) == 5


def test_the_report_names_a_bfcl_sets_live_calls_and_every_row_whose_set_up_failed(tmp_path):
    generation = {**GENERATION, "bfcl_mt": {**GENERATION["everyday"], "rows_with_tools": 9, "tool_calls": 40,
                                            "cuts_by_reason": {"step_limit": 1}, "executed_steps": 31,
                                            "calls_made": 40, "calls_expected": 36,
                                            "execution_errors_by_reason": {"unknown_function": 2, "raised": 1},
                                            "setup_failed": 1, "setup_failed_ids": ["multi_turn_base_7"]}}
    text = report(tmp_path, report_inputs(results(evaluations()), generation=generation))
    section = text.split("## Tool-call data")[1].split("\n## ")[0]
    assert "| bfcl_mt | 31 | 40 | 36 | 3 (raised 1, unknown function 2) | 1 (multi_turn_base_7) |" in section
    assert "| 1 (11%: step limit 1) |" in section


def test_the_grid_keeps_a_conversation_going_past_an_answer_cut_by_max_tokens(monkeypatch):
    """Generation ends a conversation at an answer cut by max_tokens (a row built on a cut answer); the grid's load
    is the set's turns, so on the same loop it sends the next turn all the same, as its own loop did."""
    monkeypatch.setattr(ev, "MIN_READINGS", 0)
    prompt = Prompt("p", ["length=0 first", "second"])
    with MeteredToolSim() as sim:
        run, _, _ = asyncio.run(ev.run_set(sim.base_url, "m", [prompt], {"max_tokens": 8}, 1, rounds=1))
        sent = sim.requests
    assert [m["content"] for m in sent[-1]["messages"] if m["role"] == "user"] == ["length=0 first", "second"]
    assert run.sent == len(sent) == 2


def test_the_grid_ends_a_conversation_at_the_servers_context_counted_and_frees_its_slot(monkeypatch):
    """Issue 57 review: the grid sent every request, so a live BFCL row that outgrew max_model_len got the server's
    400, taken for our fault, and the evaluate job failed at every rerun. The grid now ends it where generation
    does: its earlier turns sent, the turn that would not fit never, counted; the next prompt takes its slot."""
    from draftsmith.data.chat import Renderer
    from draftsmith.generation.generate import ContextLimit
    from tests.test_generate_tools import WordTokenizer

    monkeypatch.setattr(ev, "MIN_READINGS", 0)
    long_turn = "word " * 40
    prompts = [Prompt("tools", ["short question", long_turn], tools=TOOLS), Prompt("other", ["hi"], tools=TOOLS)]
    chat = Prompt("chat", ["short question", long_turn])
    with MeteredToolSim() as sim:
        run, _, _ = asyncio.run(ev.run_set(sim.base_url, "m", prompts, {"max_tokens": 8}, 1, rounds=1,
                                           context=ContextLimit(30, Renderer(WordTokenizer()))))
        sent = list(sim.requests)
        chat_run, _, _ = asyncio.run(ev.run_set(sim.base_url, "m", [chat], {"max_tokens": 8}, 1, rounds=1,
                                                context=ContextLimit(30, Renderer(WordTokenizer()))))
        chat_sent = list(sim.requests)[len(sent):]
    # a chat row's conversation is its dataset's turns: not counted on the client inside the timed window
    assert any(long_turn in (m["content"] or "") for body in chat_sent for m in body["messages"])
    assert chat_run.ends_at_context == 0
    assert not any(long_turn in (m["content"] or "") for body in sent for m in body["messages"])
    firsts = [body["messages"][0]["content"] for body in sent]
    assert set(firsts) == {"short question", "hi"} and run.dispatched == len(sent)
    assert run.ends_at_context == firsts.count("short question") >= 1
    assert run.as_dict()["ends_at_context"] == run.ends_at_context


def test_the_grids_context_is_the_servers_counted_with_the_targets_tokenizer_and_every_run_gets_it(monkeypatch):
    from contextlib import contextmanager
    from types import SimpleNamespace

    from tests.test_generate_tools import WordTokenizer

    monkeypatch.setattr(ev, "load_tokenizer", lambda target: WordTokenizer())
    monkeypatch.setattr(ev, "model_context", lambda target: 32768)
    plain = ev.Grid({"s": [Prompt("a", ["hi"])]}, [0.0], 32, [1], False, "vllm", "text")
    limited = ev.with_context(plain, None, {"max_model_len": 4096})
    assert limited.context.tokens == 4096 and limited.context.tool_rendering == "text"
    assert isinstance(limited.context.renderer.tokenizer, WordTokenizer) and not limited.context.renderer.kwargs
    assert ev.with_context(plain, None, {}).context.tokens == 32768  # no max_model_len: the target's own
    monkeypatch.setattr(ev, "model_context", lambda target: None)
    assert ev.with_context(plain, None, {}).context is None
    seen = []

    def runs_at(base_url, *args, context=None, **kwargs):
        seen.append((base_url, context))
        return [{"set": "s", "temperature": 0.0, "prompts": 1, "output_tok_s": 10.0}]

    def server(name):
        @contextmanager
        def start():
            yield SimpleNamespace(base_url=name, exited_before_stop=None)
        return start

    monkeypatch.setattr(ev, "warm_up", lambda *args: None)
    monkeypatch.setattr(ev, "runs_at", runs_at)
    ev.measure_method(limited, "m", server("baseline"), {("finetuned", 3): server("k3")})
    assert seen == [("baseline", limited.context), ("k3", limited.context)]


@pytest.mark.skipif(importlib.util.find_spec("bfcl_eval") is None, reason="bfcl-eval is not installed")
def test_a_set_none_of_whose_rows_set_up_gives_its_cell_the_reason_it_has_no_figure(monkeypatch, tmp_path):
    """The window sent nothing and the cell had no figure, with only per-row warnings in the log: the run and the
    cell now say why, as a cell whose server failed does, and the report renders it."""
    monkeypatch.setattr(ev, "MIN_READINGS", 0)
    good = bfcl_row(["calls=pwd:"])
    broken = [bfcl_row(["calls=pwd:"], f"multi_turn_base_{i}", {**good.environment, "classes": ["NoSuchAPI"]})
              for i in (8, 9)]
    with MeteredToolSim() as sim:
        run, _, _ = asyncio.run(ev.run_set(sim.base_url, "m", broken, {"max_tokens": 8}, 1, rounds=1))
        assert not sim.requests
        partly, _, _ = asyncio.run(ev.run_set(sim.base_url, "m", [good, broken[0]], {"max_tokens": 8}, 1,
                                              rounds=1))
    measured = run.as_dict()
    assert measured["output_tok_s"] is None and measured["setup_failed"] == 2
    why = "set-up failed for 2 of 2 rows (first: multi_turn_base_8: NoSuchAPI: KeyError"
    assert measured["not_measured"].startswith(why)
    assert partly.setup_failed == 1 and partly.not_measured is None  # a row left: the set has its figure
    assert partly.as_dict()["output_tok_s"]
    monkeypatch.setattr(ev, "warm_up", lambda *args: None)
    monkeypatch.setattr(ev, "measure", lambda *args, **kwargs: {**measured, "held": True, "held_why": None})
    grid_ = ev.Grid({"bfcl_mt": broken}, [0.0], 32, [2], False, "vllm")

    def server(name):
        from contextlib import contextmanager
        from types import SimpleNamespace

        @contextmanager
        def start():
            yield SimpleNamespace(base_url=name, exited_before_stop=None)
        return start

    done = ev.measure_method(grid_, "m", server("baseline"), {("finetuned", 3): server("k3")})
    [cell] = done["cells"]
    assert cell["failed"].startswith(f"prompt set bfcl_mt: {why}") and cell["runs"][0]["speedup"] is None
    evaluation = evaluations()
    evaluation["eagle3"]["cells"][0] |= {"failed": cell["failed"]}
    text = report(tmp_path, report_inputs(results(evaluation)))
    assert f"EAGLE-3 k=3 at concurrency 2: not measured, prompt set bfcl_mt: {why}" in text
