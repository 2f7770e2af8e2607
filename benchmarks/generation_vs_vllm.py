"""Output throughput of draftsmith's generation client vs vLLM's own `vllm bench serve` client.

Both clients hit the same vLLM server with the same prompts (as chat user messages), the same
concurrency and exactly the same output length (`ignore_eos`, temperature 0), in alternating
rounds; the script prints output tok/s of each, per round and as medians, and the ratio
draftsmith / vLLM (goal: >= 1.0).

    .venv/bin/python benchmarks/generation_vs_vllm.py                      # embedded target
    .venv/bin/python benchmarks/generation_vs_vllm.py --prompts ../shared/data/dolly_3k.jsonl --num-prompts 128
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from draftsmith.config.load import config_files, load_layers  # noqa: E402
from draftsmith.config.target import resolve  # noqa: E402
from draftsmith.data.datasets import load_prompts  # noqa: E402
from draftsmith.generation.generate import GenerationSettings, Outputs, generate, make_client  # noqa: E402
from draftsmith.generation.model_prep import prepare_gguf  # noqa: E402
from draftsmith.generation.server import ServerSpec, managed_server  # noqa: E402

VLLM_BENCH = "from vllm.benchmarks.serve import add_cli_args, main\n" \
             "from vllm.utils.argparse_utils import FlexibleArgumentParser\n" \
             "import sys\np = FlexibleArgumentParser()\nadd_cli_args(p)\nmain(p.parse_args(sys.argv[1:]))\n"


def run_vllm_bench(base: str, model: str, prompts_file: Path, args, out_dir: Path, round_no: int) -> float:
    name = f"vllm_{round_no}.json"
    cmd = [sys.executable, "-c", VLLM_BENCH, "--backend", "openai-chat", "--base-url", base,
           "--endpoint", "/v1/chat/completions", "--model", model, "--dataset-name", "custom",
           "--dataset-path", str(prompts_file), "--skip-chat-template", "--disable-shuffle",
           "--num-prompts", str(args.num_prompts), "--custom-output-len", str(args.max_tokens), "--ignore-eos",
           "--temperature", "0", "--max-concurrency", str(args.concurrency), "--request-rate", "inf",
           "--disable-tqdm", "--save-result", "--result-dir", str(out_dir), "--result-filename", name]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    result = json.loads((out_dir / name).read_text())
    return result["output_throughput"]


async def run_draftsmith(url: str, model: str, prompts, args, out_dir: Path, round_no: int) -> float:
    settings = GenerationSettings(max_tokens=args.max_tokens, temperature=0.0, concurrency=args.concurrency,
                                  extra_body={"ignore_eos": True}, fsync_every=64)
    client = make_client(url, model, settings, None, None)
    d = out_dir / f"ours_{round_no}"
    started = time.monotonic()
    try:
        stats = await generate(prompts, client, settings, Outputs(d / "r.jsonl", d / "s.json", d / "e.jsonl",
                                                                  d / "j.jsonl"),
                               max_samples=None, token_budget=None, dataset="bench")
    finally:
        await client.aclose()
    return stats["completion_tokens"] / (time.monotonic() - started)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(REPO / "results/models/smollm2-135m-instruct"))
    ap.add_argument("--prompts", default=str(REPO / "config/prompts/everyday.jsonl"))
    ap.add_argument("--num-prompts", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--server-arg", action="append", default=["--enforce-eager"])
    args = ap.parse_args()
    model = Path(args.model)
    if not model.exists():
        prepare_gguf(resolve(load_layers(config_files(REPO, []), {})["target"]).gguf_file(), model)
    prompts = [p for p in load_prompts(Path(args.prompts), max_samples=args.num_prompts).prompts if len(p.turns) == 1]
    args.num_prompts = len(prompts)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        prompts_file = out / "prompts.jsonl"
        prompts_file.write_text("".join(json.dumps({"prompt": p.turns[0]}) + "\n" for p in prompts))
        spec = ServerSpec(model=str(model), max_model_len=2048, extra_args=args.server_arg,
                          env={"VLLM_CPU_KVCACHE_SPACE": "2"})
        ours, theirs = [], []
        with managed_server(spec, out / "server.log") as server:
            url = server.base_url
            asyncio.run(run_draftsmith(url, str(model), prompts[:4], args, out, -1))  # warm-up
            for r in range(args.rounds):
                ours.append(asyncio.run(run_draftsmith(url, str(model), prompts, args, out, r)))
                theirs.append(run_vllm_bench(url.removesuffix("/v1"), str(model), prompts_file, args, out, r))
                print(f"round {r}: draftsmith {ours[-1]:.1f} tok/s   vllm bench serve {theirs[-1]:.1f} tok/s")
    a, b = statistics.median(ours), statistics.median(theirs)
    print(f"\n{args.num_prompts} prompts x {args.max_tokens} tokens, concurrency {args.concurrency}, "
          f"{args.rounds} rounds (medians)")
    print(f"{'client':<20}{'output tok/s':>14}")
    print(f"{'draftsmith':<20}{a:>14.1f}")
    print(f"{'vllm bench serve':<20}{b:>14.1f}")
    print(f"ratio draftsmith / vllm: {a / b:.3f}")


if __name__ == "__main__":
    main()
