import asyncio
import json
import signal
import subprocess
import sys
import time

import pytest

from draftsmith.data.datasets import Prompt
from draftsmith.generation.client import HealthPolicy, RetryPolicy
from draftsmith.generation.generate import (
    RECORD_FORMAT,
    GenerationFailed,
    GenerationSettings,
    Journal,
    Outputs,
    generate,
    has_work,
    make_client,
    settings_key,
)
from tests.conftest import REPO
from tests.fault_server import FaultServer


@pytest.fixture()
def server():
    with FaultServer() as srv:
        yield srv


def outputs(tmp_path):
    return Outputs(tmp_path / "out.jsonl", tmp_path / "stats.json", tmp_path / "errors.jsonl",
                   tmp_path / "journal" / "j.jsonl")


def run(server, prompts, tmp_path, *, settings=None, max_samples=None, token_budget=None, api_key_env=None,
        headers=None):
    settings = settings or GenerationSettings(concurrency=4, request_timeout_s=1.0, connect_timeout_s=1.0,
                                              max_error_fraction=1.0)
    client = make_client(server.base_url, "m", settings, api_key_env, headers or {"X-Extra": "yes"})
    client.retry = RetryPolicy(max_attempts=settings.max_attempts, backoff_base_s=0.01, backoff_max_s=0.05)

    async def go():
        try:
            return await generate(prompts, client, settings, outputs(tmp_path), max_samples=max_samples,
                                  token_budget=token_budget, dataset="d")
        finally:
            await client.aclose()

    return asyncio.run(go())


def read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def P(pid, *turns):
    return Prompt(pid, list(turns))


def test_every_fault_is_retried_or_counted(server, tmp_path):
    prompts = [P(f"p{k}", f"q{k} fault={k}x1") for k in ("500", "429", "reset", "timeout", "malformed", "empty")]
    prompts += [P("p503", "q fault=503x2"), P("dead", "q fault=500xall"), P("bad", "q fault=400x1"),
                P("late400", "q fault=503x1 then=400")]
    stats = run(server, prompts, tmp_path)
    got = {r["id"] for r in read(tmp_path / "out.jsonl")}
    assert got == {p.id for p in prompts} - {"dead", "bad", "late400"}
    errors = {e["id"]: e for e in read(tmp_path / "errors.jsonl")}
    assert errors["dead"]["error_class"] == "http_500" and errors["dead"]["attempts"] == 5
    assert errors["bad"]["error_class"] == "http_400" and errors["bad"]["attempts"] == 1
    assert errors["late400"]["error_class"] == "http_400" and errors["late400"]["attempts"] == 2
    assert stats["errors"] == 3 and stats["errors_by_class"] == {"http_500": 1, "http_400": 2}
    assert stats["retries_by_class"] == {"http_500": 1 + 4, "http_429": 1, "connection": 1, "timeout": 1,
                                         "malformed_json": 1, "empty_choices": 1, "http_503": 2 + 1}
    assert stats["records"] == 7


@pytest.mark.parametrize("status", [501, 505])
def test_not_implemented_is_not_retried(server, tmp_path, status):
    run(server, [P("x", f"q fault={status}xall")], tmp_path)
    (error,) = read(tmp_path / "errors.jsonl")
    assert error["error_class"] == f"http_{status}" and error["attempts"] == 1


def test_retry_after_is_capped_and_must_be_finite():
    import httpx

    from draftsmith.generation.client import _retry_after

    policy = RetryPolicy(backoff_base_s=0.01, backoff_max_s=0.05, max_retry_after_s=30)
    assert policy.delay(1, retry_after=3.0) == 3.0
    assert policy.delay(1, retry_after=86400.0) == 30
    assert policy.delay(3, retry_after=None) <= 0.05
    for value, expected in (("7", 7.0), ("inf", None), ("nan", None), ("-3", 0.0), ("soon", None)):
        assert _retry_after(httpx.Response(429, headers={"Retry-After": value})) == expected


def test_transport_errors_of_every_class_are_classified(server, tmp_path):
    prompts = [P("gz", "q fault=badgzipx1"), P("loop", "q fault=redirectxall")]
    stats = run(server, prompts, tmp_path)
    assert [r["id"] for r in read(tmp_path / "out.jsonl")] == ["gz"]  # a broken body is retried
    (error,) = read(tmp_path / "errors.jsonl")
    assert error["id"] == "loop" and error["error_class"] == "request"  # a redirect loop is final
    assert stats["retries_by_class"] == {"transport": 1}


def test_headers_take_values_from_the_environment(server, tmp_path, monkeypatch):
    monkeypatch.setenv("DS_HEADER_SECRET", "hdr-secret")
    run(server, [P("a", "a")], tmp_path, headers={"X-Api-Key": {"env": "DS_HEADER_SECRET"}, "X-Plain": "p"})
    assert server.headers[-1]["X-Api-Key"] == "hdr-secret" and server.headers[-1]["X-Plain"] == "p"
    assert not any("hdr-secret" in p.read_text() for p in tmp_path.rglob("*") if p.is_file())
    monkeypatch.delenv("DS_HEADER_SECRET")
    with pytest.raises(ValueError, match=r"DS_HEADER_SECRET .generation_server.headers.X-Api-Key. is not set"):
        run(server, [P("a", "a")], tmp_path, headers={"X-Api-Key": {"env": "DS_HEADER_SECRET"}})


def test_token_budget_stops_launching(server, tmp_path):
    prompts = [P(f"p{i}", f"q{i} tokens=10") for i in range(10)]
    settings = GenerationSettings(concurrency=1, request_timeout_s=5)
    journal = tmp_path / "journal" / "j.jsonl"
    assert has_work(prompts, journal, None, 35)
    stats = run(server, prompts, tmp_path, settings=settings, token_budget=35)
    # Launch while journaled + expected in-flight < budget: 0, 10, 20, 30 launch; 40 stops.
    assert stats["records"] == 4 and stats["completion_tokens"] == 40
    # Already at budget: no server is needed, and a rerun finishes at once without a request.
    assert not has_work(prompts, journal, None, 35) and has_work(prompts, journal, None, 50)
    assert not has_work(prompts, journal, 4, None)
    before = len(server.requests)
    run(server, prompts, tmp_path, settings=settings, token_budget=35)
    assert len(server.requests) == before


def test_max_samples_and_finish_reason_policies(server, tmp_path):
    prompts = [P("a", "a finish=length"), P("b", "b"), P("c", "c finish=length"), P("d", "d")]
    stats = run(server, prompts, tmp_path / "drop", settings=GenerationSettings(finish_reason_policy="drop"))
    assert [r["id"] for r in read(tmp_path / "drop" / "out.jsonl")] == ["b", "d"]
    assert stats["dropped_truncated"] == 2
    run(server, prompts, tmp_path / "mark", settings=GenerationSettings(finish_reason_policy="mark"), max_samples=3)
    marked = {r["id"]: r["truncated"] for r in read(tmp_path / "mark" / "out.jsonl")}
    assert marked == {"a": True, "b": False, "c": True}


def test_multi_turn_reasoning_and_secret_handling(server, tmp_path, monkeypatch):
    monkeypatch.setenv("DS_TEST_KEY", "sk-very-secret")
    run(server, [P("mt", "first think", "second")], tmp_path, api_key_env="DS_TEST_KEY")
    (rec,) = read(tmp_path / "out.jsonl")
    roles = [m["role"] for m in rec["messages"]]
    assert roles == ["user", "assistant", "user", "assistant"]
    assert rec["messages"][1]["reasoning"] == "thinking it over"
    assert "reasoning" not in rec["messages"][3]
    assert len(server.requests[-1]["messages"]) == 3  # the second turn saw the first answer
    assert set(server.auth_headers) == {"Bearer sk-very-secret"}
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert "sk-very-secret" not in path.read_text()


def test_a_turn_cut_by_max_tokens_ends_the_conversation(server, tmp_path):
    run(server, [P("mt", "first finish=length", "second")], tmp_path)
    (rec,) = read(tmp_path / "out.jsonl")
    assert [m["role"] for m in rec["messages"]] == ["user", "assistant"] and rec["finish_reasons"] == ["length"]


def test_missing_api_key_env_is_a_clear_error(server, tmp_path, monkeypatch):
    monkeypatch.delenv("DS_ABSENT_KEY", raising=False)
    with pytest.raises(ValueError, match=r"DS_ABSENT_KEY .generation_server.api_key_env. is not set"):
        run(server, [P("a", "a")], tmp_path, api_key_env="DS_ABSENT_KEY")


def test_resume_skips_journaled_ids_and_drops_a_cut_line(server, tmp_path):
    prompts = [P(f"p{i}", f"q{i}") for i in range(5)]
    run(server, prompts[:2], tmp_path)
    journal = tmp_path / "journal" / "j.jsonl"
    with journal.open("a") as fh:
        fh.write('{"format": 2, "id": "p2", "status": "o')  # a kill -9 mid-write
    sent_before = len(server.requests)
    run(server, prompts, tmp_path)
    assert len(server.requests) - sent_before == 3  # p2 (cut), p3, p4
    ids = [r["id"] for r in read(tmp_path / "out.jsonl")]
    assert ids == [p.id for p in prompts]
    assert len(read(journal)) == 5


def test_an_edited_prompt_is_answered_again_and_nothing_else(server, tmp_path):
    prompts = [P(f"p{i}", f"q{i}") for i in range(4)]
    run(server, prompts, tmp_path)
    sent_before = len(server.requests)
    edited = [*prompts[:2], P("p2", "q2 edited"), prompts[3]]
    run(server, edited, tmp_path)
    assert [r["messages"][0]["content"] for r in server.requests[sent_before:]] == ["q2 edited"]
    by_id = {r["id"]: r for r in read(tmp_path / "out.jsonl")}
    assert by_id["p2"]["messages"][1]["content"] == "answer to q2 edited" and len(by_id) == 4


def test_journal_name_depends_on_answers_not_on_paths():
    settings = GenerationSettings(max_tokens=64)
    assert settings_key("target", settings) == settings_key("target", GenerationSettings(max_tokens=64,
                                                                                         concurrency=7))
    assert settings_key("target", settings) != settings_key("target", GenerationSettings(max_tokens=65))
    assert settings_key("target", settings) != settings_key("other", settings)


def test_journal_from_another_format_is_refused(tmp_path):
    path = tmp_path / "j.jsonl"
    path.write_text(json.dumps({"format": 0, "id": "x"}) + "\n")
    with pytest.raises(ValueError, match=r"record format 0.*delete the journal"):
        Journal(path, 1).load()


def test_a_damaged_journal_line_costs_that_answer_only(tmp_path, caplog):
    """A line that cannot be read (a torn write sealed by a later append, a bad disk block) used to
    end the reading, and the journal was truncated there: every answer after it was paid again."""
    path = tmp_path / "j.jsonl"
    good = [{"format": RECORD_FORMAT, "id": f"p{i}", "status": "ok"} for i in range(3)]
    path.write_text(json.dumps(good[0]) + '\n{"format": 3, "id": "p' + "\n" + json.dumps(good[1]) + "\n"
                    + json.dumps(good[2]) + "\n" + '{"format": ')
    assert sorted(Journal(path, 1).load()) == ["p0", "p1", "p2"]
    assert "skipped the line at byte" in caplog.text and "last line was cut" in caplog.text
    assert path.read_text().endswith(json.dumps(good[2]) + "\n")  # the cut tail is gone, the rest kept


def test_too_many_failed_prompts_fail_the_run_and_keep_the_journal(server, tmp_path):
    prompts = [P(f"p{i}", f"q{i}" + (" fault=400xall" if i % 10 == 0 else "")) for i in range(50)]
    settings = GenerationSettings(concurrency=8, request_timeout_s=5, max_error_fraction=0.05)
    with pytest.raises(GenerationFailed, match=r"5 of 50 prompts failed \(10.0%, above max_error_fraction 5.0%\)"):
        run(server, prompts, tmp_path, settings=settings)
    assert not (tmp_path / "out.jsonl").exists()
    assert len(read(tmp_path / "journal" / "j.jsonl")) == 45
    stats = run(server, prompts, tmp_path, settings=GenerationSettings(max_error_fraction=0.1))
    assert stats["records"] == 45 and stats["prompts_sent_this_run"] == 5  # only the failed ones again


def test_an_exited_managed_server_stops_the_run_at_once(server, tmp_path):
    prompts = [P(f"p{i}", f"q{i} delay=0.3") for i in range(40)]
    settings = GenerationSettings(concurrency=2, request_timeout_s=5)
    client = make_client(server.base_url, "m", settings, None, None)
    exited_at = time.monotonic() + 1.0

    def server_exit():
        return "the managed server exited with code -9" if time.monotonic() > exited_at else None

    async def go():
        try:
            return await generate(prompts, client, settings, outputs(tmp_path), max_samples=None, token_budget=None,
                                  dataset="d", server_exit=server_exit)
        finally:
            await client.aclose()

    started = time.monotonic()
    with pytest.raises(GenerationFailed, match=r"exited with code -9.*no output was written.*rerun resumes"):
        asyncio.run(go())
    assert time.monotonic() - started < 5
    assert not (tmp_path / "out.jsonl").exists() and (tmp_path / "journal" / "j.jsonl").exists()


DRIVER = """
import asyncio, sys
from pathlib import Path
from draftsmith.data.datasets import Prompt
from draftsmith.generation.generate import GenerationSettings, Outputs, generate, make_client
url, out = sys.argv[1], Path(sys.argv[2])
prompts = [Prompt(f"p{i}", [f"q{i} delay={0.2 * (i % 5):.1f}"]) for i in range(40)]
settings = GenerationSettings(concurrency=4, fsync_every=1)
async def main():
    client = make_client(url, "m", settings, None, None)
    try:
        await generate(prompts, client, settings, Outputs(out / "r.jsonl", out / "s.json", out / "e.jsonl",
                       out / "j.jsonl"), max_samples=None, token_budget=None, dataset="d")
    finally:
        await client.aclose()
asyncio.run(main())
"""


def start_driver(server, tmp_path):
    return subprocess.Popen([sys.executable, "-c", DRIVER, server.base_url, str(tmp_path)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_journal(path, lines, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().count("\n") >= lines:
            return
        time.sleep(0.05)
    raise AssertionError(f"{path} never reached {lines} lines")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killed_run_resumes_with_every_id_exactly_once(server, tmp_path, sig):
    proc = start_driver(server, tmp_path)
    wait_for_journal(tmp_path / "j.jsonl", 6)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0
    if sig == signal.SIGTERM:
        assert "interrupted" in err and "rerun resumes" in err
    assert not (tmp_path / "r.jsonl").exists()  # the declared output only appears when complete
    journaled = [json.loads(line)["id"] for line in (tmp_path / "j.jsonl").read_text().splitlines()
                 if line.endswith("}")]
    proc = start_driver(server, tmp_path)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    ids = [json.loads(line)["id"] for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert sorted(ids) == sorted(f"p{i}" for i in range(40)) and len(ids) == len(set(ids)) == 40
    resent = [r["messages"][0]["content"].split()[0] for r in server.requests[-(40 - len(journaled)):]]
    assert not {f"q{j[1:]}" for j in journaled} & set(resent)  # journaled ids were not sent again


def test_requests_spread_over_several_endpoints(tmp_path):
    with FaultServer() as one, FaultServer() as two:
        settings = GenerationSettings(concurrency=4, request_timeout_s=5)
        client = make_client([one.base_url, two.base_url], "m", settings, None, None,
                             health=HealthPolicy(cooldown_s=0.1))

        async def go():
            try:
                return await generate([P(f"p{i}", f"q{i} delay=0.1") for i in range(8)], client, settings,
                                      outputs(tmp_path), max_samples=None, token_budget=None, dataset="d")
            finally:
                await client.aclose()

        stats = asyncio.run(go())
    assert stats["records"] == 8 and len(one.requests) + len(two.requests) == 8
    assert len(one.requests) >= 2 and len(two.requests) >= 2
    assert sorted(stats["requests_by_endpoint"]) == sorted([len(one.requests), len(two.requests)])


def Traj(pid, n, extra=""):
    """A trajectory of ``n`` observations, the dataset's action after each but the last (issue 58)."""
    return Prompt(pid, [f"{pid}-obs{k}{extra}" for k in range(n)], "sys",
                  history=[f"{pid}-act{k}" for k in range(n - 1)])


def test_a_trajectory_is_answered_turn_by_turn_on_its_own_history(server, tmp_path):
    """Issue 58: each turn one request whose context is the dataset's conversation up to it, its answer a
    record of its own (id {id}#{k}) whose row supervises that turn only; the budget counts trajectories."""
    stats = run(server, [Traj("t", 3), P("chat", "q1", "q2")], tmp_path, max_samples=2)
    sent = {body["messages"][-1]["content"]: body["messages"] for body in server.requests}
    assert [m["content"] for m in sent["t-obs2"]] == ["sys", "t-obs0", "t-act0", "t-obs1", "t-act1", "t-obs2"]
    assert [m["content"] for m in sent["t-obs0"]] == ["sys", "t-obs0"]
    got = read(tmp_path / "out.jsonl")
    assert [r["id"] for r in got] == ["t#0", "t#1", "t#2", "chat"]
    assert all(r["supervise"] == "last" and r["trajectory"] == "t" for r in got[:3]) and "supervise" not in got[3]
    assert got[1]["messages"][-2:] == [{"role": "user", "content": "t-obs1"},
                                       {"role": "assistant", "content": "answer to t-obs1"}]
    assert len(got[1]["turns"]) == 1 and got[1]["messages"][2]["content"] == "t-act0"  # the dataset's action
    assert stats["records"] == 4 and stats["trajectories"] == 1 and stats["completion_tokens"] == 5 * 5


BASH = {"type": "function", "function": {"name": "bash", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}


def OpenHands(pid):
    """An OpenHands trajectory whose first action is a call written as text, answered by its EXECUTION RESULT."""
    return Prompt(pid, [f"{pid}-task", "EXECUTION RESULT of [bash]:\nfile.py", f"{pid}-nudge"], "sys",
                  [BASH], history=["Looking.\n<function=bash>\n<parameter=command>ls</parameter>\n</function>",
                                   "Done, I think."], calls="openhands")


@pytest.mark.parametrize("rendering", ["template", "text"])
def test_an_openhands_trajectory_sends_its_calls_as_calls_only_where_the_template_renders_them(server, tmp_path,
                                                                                             rendering):
    """Issue 58: with the template rendering calls, the dataset's calls and results go as tool_calls and tool
    messages with the tools; rendered as text, the export's own text goes and no tools (its system prompt
    describes them). Either way a turn's record keys on the prompt's digest, so a rerun resends nothing."""
    settings = GenerationSettings(concurrency=1, request_timeout_s=1.0, connect_timeout_s=1.0,
                                  max_error_fraction=1.0, tool_rendering=rendering)
    prompt = OpenHands("o")
    run(server, [prompt], tmp_path, settings=settings)
    last = server.requests[-1]
    if rendering == "template":
        assert last["tools"] == [BASH]
        assert [m["role"] for m in last["messages"]] == ["system", "user", "assistant", "tool", "assistant", "user"]
        assert last["messages"][2]["tool_calls"][0]["function"] == {"name": "bash", "arguments": '{"command": "ls"}'}
        assert last["messages"][3]["content"] == "file.py"
    else:
        assert "tools" not in last and [m["content"] for m in last["messages"][2:4]] == [prompt.history[0],
                                                                                         prompt.turns[1]]
    got = read(tmp_path / "out.jsonl")
    assert [r["id"] for r in got] == ["o#0", "o#1", "o#2"] and {r["prompt_hash"] for r in got} == {prompt.digest}
    assert all(("tools" in r) == (rendering == "template") for r in got)
    sent = len(server.requests)
    run(server, [prompt], tmp_path, settings=settings)
    assert len(server.requests) == sent


def test_max_samples_and_the_budget_count_trajectories_and_every_turns_tokens(server, tmp_path):
    stats = run(server, [Traj(f"t{i}", 3) for i in range(4)], tmp_path, max_samples=2)
    assert stats["trajectories"] == 2 and stats["records"] == 6
    stats = run(server, [Traj(f"b{i}", 2, " tokens=10") for i in range(4)],
                tmp_path / "budget", token_budget=30)  # 20 tokens a trajectory: the second stops at the budget
    assert stats["trajectories"] == 2 and stats["completion_tokens"] == 30 and stats["records"] == 3


def test_the_budget_stops_trajectories_in_flight_at_their_next_turn(server, tmp_path):
    """The budget stopped launching trajectories, but those in flight (up to the concurrency) ran every turn to
    their end: at concurrency 200 and 50 turns of 8K tokens, tens of millions of tokens past the budget. A turn
    the spent budget would not have sent is not sent; the turns answered stay rows."""
    settings = GenerationSettings(concurrency=4, request_timeout_s=1.0, connect_timeout_s=1.0, max_tokens=10,
                                  max_error_fraction=1.0)
    stats = run(server, [Traj(f"b{i}", 6, " tokens=10") for i in range(3)], tmp_path, settings=settings,
                token_budget=30)  # three launched at once (10 expected each), 60 tokens a trajectory
    assert 30 <= stats["completion_tokens"] <= 60, stats["completion_tokens"]  # at most a turn each in flight
    assert stats["records"] == stats["completion_tokens"] // 10


def test_a_trajectory_resumes_turn_by_turn_and_resends_no_journaled_turn(server, tmp_path):
    prompts = [Traj("t", 4), Traj("u", 2)]
    run(server, prompts, tmp_path)
    journal = tmp_path / "journal" / "j.jsonl"
    lines = journal.read_text().splitlines()
    kept = [line for line in lines if json.loads(line)["id"] not in ("t#2", "t#3")]  # a kill before those turns
    journal.write_text("\n".join(kept) + "\n" + lines[-1][:20])  # and one line cut mid-write
    sent_before = len(server.requests)
    stats = run(server, prompts, tmp_path)
    assert [body["messages"][-1]["content"] for body in server.requests[sent_before:]] == ["t-obs2", "t-obs3"]
    assert [r["id"] for r in read(tmp_path / "out.jsonl")] == ["t#0", "t#1", "t#2", "t#3", "u#0", "u#1"]
    assert stats["prompts_sent_this_run"] == 1


def test_a_turn_that_would_pass_the_context_ends_its_trajectory_and_is_no_error(server, tmp_path):
    from draftsmith.data.chat import Renderer
    from draftsmith.generation.generate import ContextLimit
    from tests.test_generate_tools import WordTokenizer

    long = Prompt("long", ["obs0", "obs1 " + "word " * 30, "obs2"], history=["act0", "act1"])
    settings = GenerationSettings(concurrency=4, request_timeout_s=1.0, max_error_fraction=0.0)
    client = make_client(server.base_url, "m", settings, None, None)

    async def go():
        try:
            return await generate([long, Traj("t", 2)], client, settings, outputs(tmp_path), max_samples=None,
                                  token_budget=None, dataset="d", context=ContextLimit(20, Renderer(WordTokenizer())))
        finally:
            await client.aclose()

    stats = asyncio.run(go())
    sent = [body["messages"][-1]["content"] for body in server.requests]
    assert [c for c in sent if c.startswith("obs")] == ["obs0"]  # obs1 not sent, nor obs2 after it
    assert [r["id"] for r in read(tmp_path / "out.jsonl")] == ["long#0", "t#0", "t#1"]
    journaled = {r["id"]: r["status"] for r in read(tmp_path / "journal" / "j.jsonl")}
    assert journaled["long#1"] == "dropped_context" and "long#2" not in journaled
    assert stats["errors"] == 0 and stats["trajectories_ended_at_context"] == 1 and stats["dropped_context"] == 1
    assert stats["trajectories"] == 2


def test_a_trajectory_turn_asks_for_no_answer_token_its_row_would_cut(server, tmp_path):
    """A turn's row is its prefix and its answer, cut at tokenize.max_length (the trajectory's context): an answer
    asked past it is generated, on a 1T target at 8K tokens of reasoning, and cut away. Each turn asks for at most
    what its prefix leaves; a turn with room for max_tokens asks for max_tokens."""
    from draftsmith.data.chat import Renderer
    from draftsmith.generation.generate import ContextLimit
    from tests.test_generate_tools import WordTokenizer

    settings = GenerationSettings(concurrency=1, request_timeout_s=1.0, max_tokens=12)
    client = make_client(server.base_url, "m", settings, None, None)

    async def go():
        try:
            return await generate([Traj("t", 2)], client, settings, outputs(tmp_path), max_samples=None,
                                  token_budget=None, dataset="d", context=ContextLimit(20, Renderer(WordTokenizer())))
        finally:
            await client.aclose()

    asyncio.run(go())
    # "system: sys user: t-obs0 assistant:" is 5 words of 20: room for the 12 asked; the second turn's 9 leave 11
    assert [body["max_tokens"] for body in server.requests] == [12, 11]


TRAJECTORY_DRIVER = DRIVER.replace(
    'prompts = [Prompt(f"p{i}", [f"q{i} delay={0.2 * (i % 5):.1f}"]) for i in range(40)]',
    'prompts = [Prompt(f"p{i}", [f"q{i}-{k} delay=0.1" for k in range(4)], history=[f"a{i}-{k}" for k in range(3)])'
    ' for i in range(12)]')


def test_a_killed_trajectory_run_resumes_with_every_turn_exactly_once(server, tmp_path):
    assert TRAJECTORY_DRIVER != DRIVER
    proc = subprocess.Popen([sys.executable, "-c", TRAJECTORY_DRIVER, server.base_url, str(tmp_path)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_journal(tmp_path / "j.jsonl", 10)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    journaled = {json.loads(line)["id"] for line in (tmp_path / "j.jsonl").read_text().splitlines()
                 if line.endswith("}")}
    assert 0 < len(journaled) < 48
    sent_before = len(server.requests)
    proc = subprocess.Popen([sys.executable, "-c", TRAJECTORY_DRIVER, server.base_url, str(tmp_path)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    ids = [json.loads(line)["id"] for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert sorted(ids) == sorted(f"p{i}#{k}" for i in range(12) for k in range(4))
    resent = {"p{}#{}".format(*body["messages"][-1]["content"].split()[0][1:].split("-"))
              for body in server.requests[sent_before:]}
    assert not resent & journaled and len(server.requests) - sent_before == 48 - len(journaled)


def test_history_enters_params_and_the_journal_name_only_when_set():
    """A project that ran before ``generation.history`` existed keeps its params, its prompts job's and its
    journal's name (so it reruns nothing); a sweagent set runs on its history with the key unset."""
    from draftsmith.config.load import result_view, validate_config
    from draftsmith.data.datasets import entry_params

    config = validate_config({"target": {"name": "t", "source": "t.gguf"},
                              "datasets": {"d": {"source": "d.jsonl", "format": "sweagent"}},
                              "evaluation": {"prompt_sets": {"e": {"source": "e.jsonl"}}}})
    entry = result_view(config)["datasets"]["d"]
    assert entry["generation"]["history"] is None and "history" not in entry_params(entry)["generation"]
    settings = GenerationSettings.from_config(entry["generation"])
    assert settings_key("t", settings) == settings_key("t", GenerationSettings())
    chosen = {**entry["generation"], "history": "dataset"}
    assert entry_params({**entry, "generation": chosen})["generation"]["history"] == "dataset"
    assert settings_key("t", GenerationSettings.from_config(chosen)) != settings_key("t", settings)


def test_a_trajectory_sets_turns_must_fit_tokenize_max_length_too():
    from draftsmith.generation.generate import context_tokens

    assert context_tokens(4096, 32768, [P("chat", "q")], 2048) == 4096  # a chat row is cut to max_length later
    assert context_tokens(4096, 32768, [P("chat", "q"), Traj("t", 2)], 2048) == 2048
    assert context_tokens(None, None, [Traj("t", 2)], 2048) == 2048
    assert context_tokens(None, None, [P("chat", "q")], 2048) is None


def test_a_trajectory_turn_the_template_cannot_render_is_an_error_of_that_turn(server, tmp_path):
    from draftsmith.data.chat import Renderer
    from draftsmith.generation.generate import ContextLimit
    from tests.test_generate_tools import WordTokenizer

    class Refusing(WordTokenizer):
        def apply_chat_template(self, messages, **kwargs):
            raise ValueError("roles must alternate")

    settings = GenerationSettings(concurrency=4, request_timeout_s=1.0, max_error_fraction=1.0)
    client = make_client(server.base_url, "m", settings, None, None)

    async def go():
        try:
            return await generate([Traj("t", 2)], client, settings, outputs(tmp_path), max_samples=None,
                                  token_budget=None, dataset="d", context=ContextLimit(30, Renderer(Refusing())))
        finally:
            await client.aclose()

    stats = asyncio.run(go())
    assert stats["errors_by_class"] == {"template": 1} and not server.requests
    assert [e["id"] for e in read(tmp_path / "errors.jsonl")] == ["t#0"]
