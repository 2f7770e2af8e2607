"""Held means held: the engine read over enough of a window, against the target alone's, a point that did
not hold measured again, and the tokens counted by the engine (issue 51, items 7 and 9)."""

import asyncio
from types import SimpleNamespace

import httpx
import pytest

from draftsmith.data.datasets import Prompt
from draftsmith.evaluation.measure import evaluate as ev
from draftsmith.generation.client import ChatResult


class Engine:
    """A fake vLLM: each request generates its prompt's number of tokens, one every 5 ms, counted by the engine
    as they come (a request cut at the window's end has counted what it generated)."""

    def __init__(self, gauge: bool = True):
        self.generated, self.running, self.gauge = 0, 0, gauge

    def metrics(self) -> str:
        text = f"# TYPE vllm:generation_tokens counter\nvllm:generation_tokens_total {self.generated}\n"
        return text + (f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running {self.running}\n"
                       if self.gauge else "")

    def client(self, *args, **kwargs):
        engine = self

        class Client:
            async def chat(self, messages, body):
                engine.running += 1
                try:
                    n = int(messages[-1]["content"])
                    for _ in range(n):
                        await asyncio.sleep(0.005)
                        engine.generated += 1
                finally:
                    engine.running -= 1
                return ChatResult(content="x", reasoning=None, finish_reason="stop", prompt_tokens=1,
                                  completion_tokens=n, attempts=1)

            async def aclose(self):
                pass

        return Client()

    def http(self, *args, **kwargs):
        engine = self

        class Metrics:
            async def __aenter__(self):
                return self

            async def __aexit__(self, *exc):
                return False

            async def get(self, url):
                return SimpleNamespace(text=engine.metrics())

        return Metrics()


@pytest.fixture
def engine(monkeypatch):
    fake = Engine()
    monkeypatch.setattr(ev, "ChatClient", fake.client)
    monkeypatch.setattr(httpx, "AsyncClient", fake.http)
    monkeypatch.setattr(ev, "SAMPLE_S", 0.01)
    return fake


def run(prompts, concurrency):
    return asyncio.run(ev.run_set("http://x/v1", "m", prompts, {}, concurrency))[0]


def test_the_window_counts_the_engines_tokens_not_the_clients(engine, monkeypatch):
    """A request cut at the window's end generated tokens inside it that no client answer carries: the engine's
    counter has them. Replacing it by the client's completed tokens reads a slower window than was served."""
    monkeypatch.setattr(ev, "MIN_READINGS", 0)
    # a, b, a, b at concurrency 2: the 60-token b's second turn is still running when the first worker runs out
    got = run([Prompt("a", ["5"]), Prompt("b", ["60"])], 2)
    assert got.completed_tokens == 70 and got.completed == 3
    assert got.output_tokens > got.completed_tokens + 10, got


def test_a_window_too_short_to_read_the_engine_is_sent_more_rounds_not_skipped(engine, monkeypatch):
    """The demo's cells at 12 were read 6-8 times and the engine's side was skipped; now the set is sent more
    rounds of its concurrency until the engine has been read MIN_READINGS times."""
    got = run([Prompt("a", ["4"]), Prompt("b", ["4"])], 2)
    assert got.readings >= ev.MIN_READINGS and got.sent > ev.requests_for(2, 2) and got.running is not None
    assert got.as_dict()["repeats"] == got.sent / 2
    engine.gauge = False  # an engine with no running gauge: no round added would read it
    assert run([Prompt("a", ["4"]), Prompt("b", ["4"])], 2).sent == ev.requests_for(2, 2)


def test_a_point_that_did_not_hold_is_measured_again_with_more_rounds_and_a_capped_engine_is_named(monkeypatch):
    from contextlib import contextmanager

    calls = []

    def runs_at(base_url, model, sets, temperatures, max_tokens, seeded, c, engine, drafting, rounds=ev.FULL_ROUNDS,
                **_):
        calls.append((base_url, rounds))
        short = rounds == ev.FULL_ROUNDS and base_url == "ramped"
        running = {"alone": 7.9, "ramped": 7.8, "capped": 4.0}[base_url]
        return [{"set": "s", "temperature": 0.0, "prompts": 12, "output_tok_s": 50.0, "readings": 20,
                 "mean_in_flight": 10.0 if short else 11.9, "held": not short, "mean_running": running}]

    def server(name):
        @contextmanager
        def started():
            yield SimpleNamespace(base_url=name)
        return started

    monkeypatch.setattr(ev, "warm_up", lambda *args: None)
    monkeypatch.setattr(ev, "runs_at", runs_at)
    grid = ev.Grid({"s": [Prompt("a", ["hi"])]}, [0.0], 32, [12], False, "vllm")
    cells = ev.measure_method(grid, "m", server("alone"), {("finetuned", 3): server("ramped"),
                                                             ("finetuned", 5): server("capped")})["cells"]
    retried = ev.RETRY_ROUNDS * ev.FULL_ROUNDS
    assert calls == [("alone", 2), ("ramped", 2), ("ramped", retried), ("capped", 2), ("capped", retried)]
    ramped, capped = (c["runs"][0] for c in cells)
    assert ramped["held"] and ramped["remeasured"] and ramped["running_vs_target"] == pytest.approx(0.987)
    assert not capped["held"] and capped["remeasured"] and capped["held_why"].startswith(
        "its engine ran 4.00 requests on average, 0.51x the target alone's 7.90")


def not_holding(evaluation: dict, k: int, c: int, why: str) -> dict:
    for cell in evaluation["cells"]:
        if (cell["k"], cell["concurrency"]) == (k, c):
            for run in cell["runs"]:
                run.update(held=False, held_why=why)
    return evaluation


def test_the_pick_ranks_a_length_that_held_above_one_that_did_not():
    """Removing the held filter from the pick passed every test: k=3 did not hold concurrency 6, k=1 did."""
    from draftsmith.evaluation.decide import pick
    from tests import grid

    eagle3 = not_holding(grid.evaluation("eagle3", {(1, 6): (1.1, 1.5), (3, 6): (1.3, 2.2)}), 3, 6,
                         "5.36 requests in flight on average, of 6")
    best = pick.best_cell(eagle3, 6, "tau")
    assert best["k"] == 1 and best["held"] and best["held_why"] is None


def test_a_finished_run_is_never_failed_at_the_pick_by_a_cell_that_did_not_hold():
    """The tiny target, 6 prompts at concurrency 6: EAGLE-3's one cell held 5.36 in flight, and the pick failed
    the run after generation, extraction and training with "no tokens per target step measured"."""
    from draftsmith.evaluation.decide import pick
    from tests import grid

    why = "5.36 requests in flight on average, of 6"
    eagle3 = not_holding(grid.evaluation("eagle3", {(3, 6): (0.8, 1.9)}), 3, 6, why)
    rows = [pick.summary("eagle3", eagle3, grid.training(), 1, "tau", 6)]
    chosen, said = pick.choose(rows, "tau", 6)
    assert chosen == "eagle3" and rows[0]["held"] is False
    assert said.endswith(f"(a cell that did not hold concurrency 6: {why}; measured as it ran), the only family "
                         "measured")
    entry = pick.serving({"eagle3": eagle3}, [6], "tau")[0]
    assert entry["nothing_held"] and not entry["plain_wins"] and entry["ranked"][0]["method"] == "eagle3"


def test_a_drafter_its_kv_cache_held_back_is_ranked_at_what_it_delivered_with_why():
    """A drafter whose engine ran half what the target alone ran (its KV cache full) was dropped, not ranked."""
    from draftsmith.evaluation.decide import pick
    from draftsmith.evaluation.render.model_card import card
    from tests import grid
    from tests.test_report import band_by_band, card_inputs

    why = "its engine ran 6.00 requests on average, 0.50x the target alone's 12.00 (20 and 20 readings)"
    eagle3 = not_holding(grid.evaluation("eagle3", {(3, 1): (1.5, 2.0), (3, 16): (1.1, 2.0)}), 3, 16, why)
    ngram = grid.evaluation("ngram", {(3, 1): (1.0, 1.1), (3, 16): (1.05, 1.2)}, trained=False)
    rows = [pick.summary("eagle3", eagle3, grid.training(), 1, "speedup", 1)]
    chosen, said = pick.choose(rows, "speedup", 1)
    results = {**pick.results({"eagle3": eagle3, "ngram": ngram}, rows, chosen, said, [1, 16], "speedup", 1, {}),
               "on_accelerator": True}
    entry = results["serving"][1]
    assert [c["method"] for c in entry["ranked"]] == ["eagle3", "ngram", "plain"] and not entry["nothing_held"]
    assert entry["not_held"] == [{"method": "eagle3", "k": 3, "why": why}]
    band = band_by_band(card(card_inputs(results))).split(
        "### Batch size 16 (measured at concurrency 16)")[1].split("## ")[0]
    assert f"Ranked at what it delivered, not at the concurrency it did not hold: EAGLE-3 3 draft tokens: {why}." \
        in band


def test_a_band_where_nothing_held_is_not_served_as_plain_serving_won():
    from draftsmith.evaluation.decide import pick
    from draftsmith.evaluation.render.model_card import card
    from tests import grid
    from tests.test_report import band_by_band, card_inputs

    why = "the target alone held 5.36 requests in flight on average, of 6"
    eagle3 = not_holding(grid.evaluation("eagle3", {(3, 1): (1.5, 2.0), (3, 6): (0.8, 2.0)}), 3, 6, why)
    rows = [pick.summary("eagle3", eagle3, grid.training(), 1, "speedup", 1)]
    chosen, said = pick.choose(rows, "speedup", 1)
    results = {**pick.results({"eagle3": eagle3}, rows, chosen, said, [1, 6], "speedup", 1, {}),
               "on_accelerator": True}
    band = band_by_band(card(card_inputs(results))).split(
        "### Batch size 6 (measured at concurrency 6)")[1].split("## ")[0]
    assert f"**No method held this concurrency** (EAGLE-3 3 draft tokens: {why})" in band
    assert "Serve without speculation" not in band and "no setting is recommended at this band" in band


def test_the_reports_serving_grid_names_a_band_where_nothing_held(tmp_path):
    from draftsmith.evaluation.decide import pick
    from draftsmith.evaluation.render.report import _serving
    from tests import grid

    why = "5.36 requests in flight on average, of 6"
    eagle3 = not_holding(grid.evaluation("eagle3", {(3, 1): (1.5, 2.0), (3, 6): (0.8, 2.0)}), 3, 6, why)
    rows = [pick.summary("eagle3", eagle3, grid.training(), 1, "speedup", 1)]
    results = pick.results({"eagle3": eagle3}, rows, *pick.choose(rows, "speedup", 1), [1, 6], "speedup", 1, {})
    text = "\n".join(_serving(results))
    assert (f"**At concurrency 6, no method held the concurrency** (EAGLE-3 k=3: {why}): ranked at what they "
            "delivered; this band is unmeasured, and plain serving did not win it.") in text
    assert "plain serving (no speculation) is fastest" not in text


def test_the_target_alone_that_did_not_hold_is_measured_again_with_more_rounds(monkeypatch):
    """Its hold divides every method's speed-up at that point: a baseline that ramped too slowly at its first
    rounds is measured once more, longer, before any method is judged against it."""
    from contextlib import contextmanager

    calls = []

    def runs_at(base_url, model, sets, temperatures, max_tokens, seeded, c, engine, drafting, rounds=ev.FULL_ROUNDS,
                **_):
        calls.append(rounds)
        held = rounds > ev.FULL_ROUNDS
        return [{"set": "s", "temperature": 0.0, "prompts": 12, "output_tok_s": 50.0 if held else 30.0,
                 "mean_in_flight": 11.9 if held else 9.0, "held": held}]

    @contextmanager
    def alone():
        yield SimpleNamespace(base_url="alone")

    monkeypatch.setattr(ev, "warm_up", lambda *args: None)
    monkeypatch.setattr(ev, "runs_at", runs_at)
    monkeypatch.setattr(ev, "gpu_memory_held", lambda: None)
    grid = ev.Grid({"s": [Prompt("a", ["hi"])]}, [0.0], 32, [12], False, "vllm")
    (point,) = ev.measure_baseline(grid, "m", alone)["baseline"]
    assert calls == [ev.FULL_ROUNDS, ev.RETRY_ROUNDS * ev.FULL_ROUNDS]
    assert point["runs"] == [{"set": "s", "temperature": 0.0, "prompts": 12, "output_tok_s": 50.0,
                              "mean_in_flight": 11.9, "held": True, "remeasured": True}]
