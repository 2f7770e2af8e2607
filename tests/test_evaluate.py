import pytest

from draftsmith.evaluation.measure import evaluate as ev
from draftsmith.evaluation.measure.evaluate import acceptance

# An excerpt of vLLM 0.32's /metrics text with speculative decoding on.
METRICS = """
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 30.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 12.0
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 7.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 4.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 1.0
"""


def test_tau_is_pooled_from_counter_deltas(monkeypatch):
    import httpx

    from draftsmith.evaluation.measure import evaluate

    monkeypatch.setattr(httpx, "get", lambda url, timeout: httpx.Response(200, text=METRICS))
    after = evaluate.scrape_spec_counters("http://x")
    assert after == {"num_drafts": 10, "num_draft_tokens": 30, "num_accepted_tokens": 12,
                     "per_pos_0": 7, "per_pos_1": 4, "per_pos_2": 1}
    before = {"num_drafts": 2, "num_draft_tokens": 6, "num_accepted_tokens": 2, "per_pos_0": 2, "per_pos_1": 0,
              "per_pos_2": 0}
    res = acceptance(before, after)
    assert res["tau_pooled"] == 1 + 10 / 8
    assert res["acceptance_rate_per_position"] == [5 / 8, 4 / 8, 1 / 8]


def test_no_drafts_gives_no_tau_rather_than_a_fake_one():
    assert acceptance({}, {"num_drafts": 0.0})["tau_pooled"] is None


def test_t1_runs_are_seeded_only_where_the_engine_can_rewind_a_generator():
    assert ev.sampling(64, 1.0, seeded=True) == {"max_tokens": 64, "temperature": 1.0, "seed": 0}
    assert "seed" not in ev.sampling(64, 1.0, seeded=False)


def test_every_cell_is_measured_alone_against_the_target_alone_of_the_same_window(monkeypatch):
    """The target alone first, then each draft length on a server of its own, never two at once; each
    cell's speed-up divides by the baseline measured in this job at the same concurrency, set and T (before,
    one baseline was measured once, earlier, and every family divided by it whatever ran beside)."""
    from contextlib import contextmanager
    from types import SimpleNamespace

    from draftsmith.data.datasets import Prompt

    events, open_servers = [], []

    def server(name):
        @contextmanager
        def started():
            assert not open_servers, f"{name} started while {open_servers} still served"
            open_servers.append(name)
            events.append(f"start {name}")
            yield SimpleNamespace(base_url=name)
            open_servers.remove(name)
        return started

    speed = {"baseline": {2: 40.0, 8: 100.0}, "k1": {2: 50.0, 8: 90.0}, "k3": {2: 60.0, 8: 80.0}}

    def runs_at(base_url, model, sets, temperatures, max_tokens, seeded, concurrency, engine, drafting, **_):
        events.append(f"{base_url} c={concurrency}")
        assert drafting is (base_url != "baseline")
        return [{"set": name, "temperature": t, "prompts": len(prompts), "output_tok_s": speed[base_url][concurrency]}
                for name, prompts in sets.items() for t in temperatures]

    monkeypatch.setattr(ev, "runs_at", runs_at)
    monkeypatch.setattr(ev, "warm_up", lambda base_url, *args: events.append(f"warm {base_url}"))
    grid = ev.Grid({"held": [Prompt("a", ["hi"])]}, [0.0, 1.0], 32, [2, 8], False, "vllm")
    measured = ev.measure_method(grid, "m", server("baseline"), {("finetuned", 1): server("k1"),
                                                                  ("finetuned", 3): server("k3")})
    assert events == ["start baseline", "warm baseline", "baseline c=2", "baseline c=8", "start k1", "warm k1",
                      "k1 c=2", "k1 c=8", "start k3", "warm k3", "k3 c=2", "k3 c=8"]
    cells = {(c["k"], c["concurrency"]): c for c in measured["cells"]}
    assert set(cells) == {(1, 2), (1, 8), (3, 2), (3, 8)}
    assert [r["speedup"] for r in cells[3, 2]["runs"]] == [1.5, 1.5] and cells[1, 8]["runs"][0]["speedup"] == 0.9
    assert cells[3, 8]["runs"][1]["baseline_tok_s"] == 100.0
    assert len(measured["server_start_s"]) == 3 and measured["window"][0] <= measured["window"][1]


def test_tokens_per_target_step_count_every_step():
    """A training-free method drafts only where it finds a match: per draft its τ looks high, per step it
    is what it is. Every target step gives one token plus the drafts it accepted."""
    before = {"num_drafts": 0.0, "num_accepted_tokens": 0.0}
    sparse = acceptance(before, {"num_drafts": 10.0, "num_accepted_tokens": 20.0}, output_tokens=200)
    assert sparse["tau_pooled"] == 3.0 and sparse["tokens_per_step"] == pytest.approx(200 / 180)
    assert acceptance(before, {"num_drafts": 0.0}, output_tokens=0)["tokens_per_step"] is None


def test_a_server_that_fails_fails_its_cells_not_the_grid(monkeypatch):
    """A drafter's server that will not start, or dies mid-cell, at one draft length: its cells say why and
    the other lengths are still measured. A target alone that cannot be served says nothing of the method:
    the job fails and records nothing, so a rerun measures it again."""
    from contextlib import contextmanager
    from types import SimpleNamespace

    import httpx

    from draftsmith.data.datasets import Prompt
    from draftsmith.generation.server import ServerError

    def server(name, fails=False):
        @contextmanager
        def started():
            if fails:
                raise ServerError("server exited with code 1 before it was ready; last lines of x.log:\nOOM")
            yield SimpleNamespace(base_url=name)
        return started

    def runs_at(base_url, model, sets, temperatures, max_tokens, seeded, c, engine, drafting, **_):
        if base_url == "k5" and c == 8:  # started, answered at c=2, then died
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        return [{"set": "held", "temperature": 0.0, "prompts": 1, "output_tok_s": 50.0}]

    monkeypatch.setattr(ev, "warm_up", lambda *args: None)
    monkeypatch.setattr(ev, "runs_at", runs_at)
    grid = ev.Grid({"held": [Prompt("a", ["hi"])]}, [0.0], 32, [2, 8], False, "vllm")
    measured = ev.measure_method(grid, "m", server("baseline"), {("finetuned", 1): server("k1", fails=True),
                                                                  ("finetuned", 3): server("k3"),
                                                                  ("finetuned", 5): server("k5")})
    cells = {(c["k"], c["concurrency"]): c for c in measured["cells"]}
    assert cells[1, 2]["failed"] == cells[1, 8]["failed"] == ("ServerError: server exited with code 1 before it "
                                                              "was ready; last lines of x.log:")
    assert not cells[1, 2]["runs"] and cells[3, 8]["runs"][0]["speedup"] == 1.0
    assert cells[5, 2]["runs"][0]["speedup"] == 1.0 and "failed" not in cells[5, 2]
    assert cells[5, 8]["failed"] == "RemoteProtocolError: Server disconnected without sending a response."
    assert "failed" not in measured
    with pytest.raises(ev.BaselineFailed, match=r"the target alone could not be measured.*ServerError.*rerun"):
        ev.measure_method(grid, "m", server("baseline", fails=True), {("finetuned", 3): server("k3")})
    # A request the server refused (4xx, as the grid's client raises it) is draftsmith's fault or the
    # config's: raised, never recorded. A server error (5xx) after the client's retries is the server's.
    from draftsmith.generation.client import RequestFailed

    def refusing(status):
        def runs(base_url, *args, **kwargs):
            if base_url == "k3":
                raise RequestFailed(f"http_{status}", "This model's maximum context length is 2048 tokens", 0)
            return runs_at(base_url, *args, **kwargs)
        return runs

    monkeypatch.setattr(ev, "runs_at", refusing(400))
    with pytest.raises(RequestFailed, match="http_400"):
        ev.measure_method(grid, "m", server("baseline"), {("finetuned", 3): server("k3")})
    monkeypatch.setattr(ev, "runs_at", refusing(500))
    failed = ev.measure_method(grid, "m", server("baseline"), {("finetuned", 3): server("k3")})["cells"][0]
    assert failed["failed"].startswith("RequestFailed: http_500")
    assert ev.our_fault(httpx.HTTPStatusError("", request=httpx.Request("POST", "http://x"),
                                              response=httpx.Response(422, request=httpx.Request("POST", "http://x"))))
    assert not ev.our_fault(RequestFailed("http_429", "busy", 5)) and not ev.our_fault(RequestFailed("timeout", "", 5))


def test_a_method_is_measured_again_when_its_own_settings_or_how_it_is_served_change():
    """The evaluate job's params: the grid, the method's own settings, and how it is served. A suffix
    measurement made with vLLM's tree of earlier answers (at T=0 it drafted the answer it had given to the
    same prompt before) is measured again; the pick's keys rerun no measurement."""
    from draftsmith.config.load import validate_config
    from draftsmith.evaluation.measure.methods import measurement_settings
    from tests.test_config import MINIMAL

    evaluation = validate_config(MINIMAL)["evaluation"]
    dflash, eagle3 = measurement_settings("dflash", evaluation), measurement_settings("eagle3", evaluation)
    assert "num_speculative_tokens" not in dflash and eagle3["num_speculative_tokens"] == [3]
    assert measurement_settings("ngram", evaluation)["ngram"] == {"prompt_lookup_min": 2, "prompt_lookup_max": 4}
    assert measurement_settings("suffix", evaluation)["suffix"] == {"suffix_decoding_max_cached_requests": 0}
    assert not {"pick_by", "pick_at", "training_free"} & set(eagle3)


def test_a_slow_start_or_a_killed_server_fails_the_job_instead_of_dropping_the_method(monkeypatch):
    """Only a failure the method causes is recorded as its cells' (the engine refusing the drafter at start,
    or erroring while drafting). A server that did not come up within server.startup_timeout_s (a shared
    filesystem at 3600 s), or that a signal ended (the OOM killer) before or while serving, was recorded too,
    and no rerun measured the method again: the pick took another family for good."""
    from contextlib import contextmanager
    from types import SimpleNamespace

    import httpx

    from draftsmith.data.datasets import Prompt
    from draftsmith.generation.server import ServerExited, StartupTimeout

    def server(name, fails=None, exit_code=None):
        @contextmanager
        def started():
            if fails:
                raise fails
            running = SimpleNamespace(base_url=name, exited_before_stop=None)
            try:
                yield running
            finally:  # as managed_server reads it, before stopping the server
                running.exited_before_stop = exit_code
        return started

    def runs_at(base_url, model, sets, temperatures, max_tokens, seeded, c, engine, drafting, **_):
        if base_url == "dies":
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        return [{"set": "held", "temperature": 0.0, "prompts": 1, "output_tok_s": 50.0}]

    monkeypatch.setattr(ev, "warm_up", lambda *args: None)
    monkeypatch.setattr(ev, "runs_at", runs_at)
    grid = ev.Grid({"held": [Prompt("a", ["hi"])]}, [0.0], 32, [2], False, "vllm")
    for fault in (StartupTimeout("server not healthy after 3600 s"), ServerExited("exited with code -9", -9),
                  ServerExited("exited with code 137", 137)):
        with pytest.raises(ev.NotTheMethod, match="nothing is recorded, a rerun measures it again"):
            ev.measure_method(grid, "m", server("baseline"), {("finetuned", 3): server("k3", fails=fault)})
    with pytest.raises(ev.NotTheMethod, match="a signal ended the server"):  # killed while drafting
        ev.measure_method(grid, "m", server("baseline"), {("finetuned", 3): server("dies", exit_code=-9)})
    # the engine refusing the drafter, or dying of an error while drafting: the method's, recorded
    refused = ev.measure_method(grid, "m", server("baseline"), {
        ("finetuned", 3): server("k3", fails=ServerExited("server exited with code 1 before it was ready", 1)),
        ("finetuned", 5): server("dies", exit_code=1)})["cells"]
    assert refused[0]["failed"].startswith("ServerExited: server exited with code 1")
    assert refused[1]["failed"].startswith("RemoteProtocolError")


def test_on_gpus_the_target_alone_is_measured_once_for_the_whole_grid(monkeypatch):
    """Every method's job started the target alone again for its baseline: on GPUs measured one at a time
    that is the same number again, at a server start each (most of an hour for a 1T target). Where the
    platform says so, the job divides by the grid's one baseline and starts no server of its own for it."""
    from contextlib import contextmanager
    from types import SimpleNamespace

    from draftsmith.core import platform
    from draftsmith.data.datasets import Prompt

    assert platform.baseline_once_per_grid("cuda") and platform.baseline_once_per_grid("cuda:1")
    assert not platform.baseline_once_per_grid("cpu")
    started = []

    def server(name):
        @contextmanager
        def start():
            started.append(name)
            yield SimpleNamespace(base_url=name)
        return start

    monkeypatch.setattr(ev, "warm_up", lambda *args: None)
    monkeypatch.setattr(ev, "runs_at", lambda base_url, *args, **kwargs: [
        {"set": "held", "temperature": 0.0, "prompts": 1, "output_tok_s": 60.0}])
    grid = ev.Grid({"held": [Prompt("a", ["hi"])]}, [0.0], 32, [2], False, "vllm")
    shared = {"baseline": [{"concurrency": 2, "runs": [{"set": "held", "temperature": 0.0, "output_tok_s": 40.0}]}],
              "window": [0.0, 1.0], "server_start_s": [30.0]}
    gpus = ["NVIDIA H200"] * 8
    monkeypatch.setattr(ev.compute, "accelerators", lambda: gpus)
    measured = ev.measure_method(grid, "m", server("baseline"), {("finetuned", 3): server("k3")},
                                 {**shared, "accelerators": ["NVIDIA H200"] * 8})
    assert started == ["k3"] and measured["baseline_shared"] and len(measured["server_start_s"]) == 1
    assert measured["cells"][0]["runs"][0]["speedup"] == 1.5
    # SLURM placed this job on other GPUs than the baseline's: it measures the target alone again
    started.clear()
    measured = ev.measure_method(grid, "m", server("baseline"), {("finetuned", 3): server("k3")},
                                 {**shared, "accelerators": ["NVIDIA H100 80GB HBM3"] * 8})
    assert started == ["baseline", "k3"] and not measured["baseline_shared"]
    assert measured["cells"][0]["runs"][0]["speedup"] == 1.0


def test_a_set_smaller_than_its_concurrency_is_cycled_and_the_window_is_the_full_batch():
    """A set of 12 prompts measured "at 16" never held 16 requests: one slot per prompt, draining to one at
    the end of every set, the ramp and the drain timed. A set is now sent as at least two rounds of its
    concurrency, and the in-flight mean is what the label promises."""
    assert ev.requests_for(12, 16) == 32 and ev.requests_for(80, 1) == 80 and ev.requests_for(80, 64) == 128
    # two requests over [0, 10]: one all through, one from 5 to past the end
    assert ev.mean_in_flight([(0.0, 10.0), (5.0, None)], 0.0, 10.0) == pytest.approx(1.5)
    assert ev.mean_in_flight([(-1.0, 4.0), (2.0, 12.0)], 0.0, 10.0) == pytest.approx(1.2)
    run = ev.SetRun(prompts=12, concurrency=16, sent=32, completed=17, output_tokens=900, window_s=3.0, in_flight=14.0,
                    dispatched=32)
    assert ev.hold(run.as_dict(), None, 16) == "14.00 requests in flight on average, of 16"
    assert run.as_dict()["repeats"] == 2.67
    assert ev.hold(ev.SetRun(12, 16, 32, 17, 900, 3.0, 15.9).as_dict(), None, 16) is None
    # The engine's own count, against the target alone's at the same point: a KV cache that fits 8 queues the rest
    # where the client cannot see it, and the cell of 16 never ran 16 at once; requests waiting for a long prompt's
    # prefill hold the target alone's mean at 7.9 of 12 too, so a method at 7.5 held what the target held.
    queued = ev.SetRun(12, 16, 32, 17, 900, 30.0, in_flight=16.0, running=8.0, peak_running=8.0, readings=60,
                       dispatched=32).as_dict()
    alone = ev.SetRun(12, 16, 32, 17, 900, 30.0, in_flight=16.0, running=14.9, peak_running=16.0, readings=60,
                      dispatched=32).as_dict()
    assert ev.hold(queued, None, 16) is None  # the client held it: the engine's side needs the target alone's
    assert ev.hold(queued, alone, 16) == ("its engine ran 8.00 requests on average, 0.54x the target alone's 14.90 "
                                          "(60 and 60 readings)")
    prefilling = ev.SetRun(12, 12, 24, 13, 900, 7.0, in_flight=11.99, running=7.5, peak_running=12.0, readings=14)
    alone = ev.SetRun(12, 12, 24, 13, 900, 7.0, in_flight=11.99, running=7.9, peak_running=12.0, readings=14)
    assert ev.hold(prefilling.as_dict(), alone.as_dict(), 12) is None
    # the target alone's own hold is judged too: a speed-up over a window that did not hold says nothing
    ramped = ev.SetRun(6, 6, 12, 7, 66, 2.4, in_flight=5.36).as_dict()
    assert ev.hold(prefilling.as_dict(), ramped, 6) == "the target alone held 5.36 requests in flight on average, of 6"
    assert ev.hold(ramped, alone.as_dict(), 6) == "5.36 requests in flight on average, of 6"
    # MT-bench's two turns per prompt: 160 requests from 80 prompts sent once
    assert ev.SetRun(80, 1, 160, 159, 9000, 60.0, 1.0, dispatched=80).as_dict()["repeats"] == 1.0


def test_sglang_figures_are_each_cells_own_from_per_request_counts():
    """SGLang's avg_spec_accept_length is a mean since the server started: every cell after the first carried
    the ones before it. Its chat answers carry each request's target steps (meta_info.spec_verify_ct, asked
    with return_meta_info), and a cell's tokens per step is its own requests' tokens over their steps."""
    from draftsmith.generation.client import ChatClient

    answer = {"choices": [{"message": {"content": "x"}, "finish_reason": "length",
                           "meta_info": {"spec_verify_ct": 12, "completion_tokens": 30}}],
              "usage": {"prompt_tokens": 5, "completion_tokens": 30}}
    assert ChatClient._parse(answer, 1).verify_steps == 12
    assert ChatClient._parse({**answer, "choices": [{"message": {"content": "x"}}]}, 1).verify_steps is None
    run = ev.SetRun(4, 2, 4, 3, 100, 2.0, 2.0, verify_steps=40, completed_tokens=90)
    assert ev.per_request_acceptance(run)["tokens_per_step"] == 90 / 40
    from draftsmith.generation.server import ServerSpec

    spec = ev.for_measurement(ServerSpec(model="m", engine="sglang"))
    assert "--enable-metrics" in spec.extra_args and "--disable-radix-cache" in spec.extra_args
    counted = ev.parse_counters("# TYPE sglang:generation_tokens_total counter\n"
                                "sglang:generation_tokens_total{model_name=\"m\"} 321.0\n"
                                "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{model_name=\"m\"} 2.0\n",
                                "sglang")
    assert counted == {"generated": 321.0, "running": 2.0}


def test_the_preflight_names_a_set_that_cannot_fill_a_concurrency_and_what_is_done_about_it(tmp_path):
    """[1, 16, 64] on a 12-prompt set: before, the preflight said nothing and the cells labelled 16 and 64
    held at most 12 requests."""
    import json

    from draftsmith.config.load import validate_config
    from draftsmith.ops import preflight
    from tests.test_config import MINIMAL

    (tmp_path / "held.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"question {i}"}) + "\n"
                                                 for i in range(12)))
    config = validate_config({**MINIMAL, "evaluation": {"prompt_sets": {"held": {"source": "held.jsonl"}},
                                                        "concurrency": [1, 16, 64]}})
    notices = [n for n in preflight.notices(config, tmp_path) if n.startswith("evaluation.prompt_sets")]
    assert notices == ["evaluation.prompt_sets.held has 12 prompts: at concurrency 16 they are sent 2.7x, 64 they "
                       "are sent 10.7x (cycled in order, each window timed while the concurrency is held); a set of "
                       "at least 128 prompts would measure distinct ones"]


# SGLang's /metrics as its production-metrics page shows it (--enable-metrics; HELP/TYPE lines, a model_name label,
# histograms beside the counters), at one moment of a run.
SGLANG_METRICS = """\
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 8.128902e+06
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 7.557572e+06
# HELP sglang:token_usage The token usage
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.28
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 16.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# HELP sglang:spec_accept_length The average acceptance length of speculative decoding.
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.71
# HELP sglang:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_sum{model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.3518979474117756e+06
sglang:time_to_first_token_seconds_bucket{le="0.001",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
sglang:time_to_first_token_seconds_bucket{le="+Inf",model_name="meta-llama/Llama-3.1-8B-Instruct"} 290.0
sglang:time_to_first_token_seconds_count{model_name="meta-llama/Llama-3.1-8B-Instruct"} 290.0
"""


def test_sglang_counters_are_read_from_its_metrics_text():
    """Only SGLang's generated tokens and running requests: its acceptance gauge is a mean since the server
    started (a cell's own comes from its requests), and vLLM's names never match."""
    assert ev.parse_counters(SGLANG_METRICS, "sglang") == {"generated": 7557572.0, "running": 16.0}
    assert ev.parse_counters(SGLANG_METRICS, "vllm") == {}


def fake_sglang(delays: dict[str, float]):
    """An SGLang stand-in: each answer takes its prompt's delay and 10 tokens, which its counter adds only once the
    request finishes (as SGLang's does); no running gauge, so no window is stretched to read one."""
    import json
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    state = {"generated": 0}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def _send(self, body: bytes, kind: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            self._send((f"# TYPE sglang:generation_tokens_total counter\nsglang:generation_tokens_total"
                        f"{{model_name=\"m\"}} {state['generated']}.0\n").encode(), "text/plain")

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            time.sleep(delays[body["messages"][-1]["content"]])
            with lock:
                state["generated"] += 10
            self._send(json.dumps({"choices": [{"message": {"content": "x"}, "finish_reason": "length"}],
                                   "usage": {"prompt_tokens": 3, "completion_tokens": 10}}).encode(),
                       "application/json")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_sglang_rounds_run_to_their_last_answer_and_count_every_token(monkeypatch):
    """SGLang counts a request's tokens only when it finishes: a window cut while the batch was full dropped every
    cut request's tokens (1.26x read against a steady 1.60x). Its round runs to its last answer, every token
    counted, and the record says how."""
    import asyncio

    from draftsmith.data.datasets import Prompt

    monkeypatch.setattr(ev, "MIN_READINGS", 0)  # the rounds as sent: this fake serves no running gauge to read
    server = fake_sglang({"slow": 0.8, "fast": 0.02})
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        # two workers: one answers "slow" alone; the other two "fast" then the second "slow", still running when
        # the first runs out of work
        prompts = [Prompt("s", ["slow"]), Prompt("f1", ["fast"]), Prompt("f2", ["fast"])]
        run, before, after = asyncio.run(ev.run_set(url, "m", prompts, {"max_tokens": 10}, 2, engine="sglang"))
    finally:
        server.shutdown()
    assert run.sent == 4 and run.completed == 4
    assert run.output_tokens == 40 == after["generated"] - before["generated"]
    assert run.as_dict()["tokens_counted"] == "completed requests"
    assert ev.SetRun(1, 1, 1, 1, 10, 1.0, 1.0).as_dict()["tokens_counted"] == "engine counter"
