"""Hidden-state storage: fp8 against bf16, side by side, and what lossless compression would add.

    .venv/bin/python benchmarks/hidden_states_storage.py [--hidden 7168] [--rows 64] [--tokens 1024]

On states shaped like a target's (normal values with a few outlier channels, as residual streams
carry), through draftsmith's own shard writer and the trainer's reader (ShardTransfer):

- bytes per token, fp8 / bf16 (issue 27's goal: at most 0.52x);
- the writer's throughput (what extraction adds to the forward pass: encode, stream, xxh3-128, fsync),
  fp8 / bf16;
- the trainer's read throughput (safetensors read, dequantization), fp8 / bf16;
- how far zlib (stdlib; zstd is not installed here) shrinks each shard, and how fast it inflates:
  a bound on what lossless compression could save on these bits.

The fp8 round-trip error per token is printed too (its bound is tested in tests/test_hidden_states.py).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import zlib
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from draftsmith.hidden_states.store import ShardStore, ShardTransfer, fingerprint, write_locations


def states(tokens: int, hidden: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    values = torch.randn(tokens, 4, hidden, generator=generator)
    values[..., :4] *= 50
    return values.to(torch.bfloat16)


def measure(storage: str, rows: list[torch.Tensor], folder: Path) -> dict:
    store = ShardStore(folder, fingerprint({"bench": 1}, [1, 2, 3], 4, "bench", storage), shard_mb=256,
                       storage=storage)
    tokens = sum(r.shape[0] for r in rows)
    started = time.perf_counter()
    with store.writer() as writer:
        for i, hs in enumerate(rows):
            writer.write(i, hs, torch.arange(hs.shape[0]))
    write_s = time.perf_counter() - started
    data = folder / "data"
    data.mkdir()
    write_locations(data, store.locations(list(range(len(rows)))))
    transfer = ShardTransfer(data)
    started = time.perf_counter()
    back = [transfer.get_cached(i)["hidden_states"].clone() for i in range(len(rows))]  # bytes read, as a batch needs
    read_s = time.perf_counter() - started
    error = max(((b.float() - r.float()).abs().amax(-1) / r.float().abs().amax(-1)).max().item()
                for b, r in zip(back, rows, strict=True))
    shards = sorted((folder / "shards").glob("*.safetensors"))
    raw = b"".join(p.read_bytes() for p in shards)
    started = time.perf_counter()
    packed = zlib.compress(raw, 1)
    deflate_s = time.perf_counter() - started
    started = time.perf_counter()
    zlib.decompress(packed)
    inflate_s = time.perf_counter() - started
    return {"bytes_per_token": len(raw) / tokens, "write_tok_s": tokens / write_s, "read_tok_s": tokens / read_s,
            "max_rel_error": error, "zlib_ratio": len(packed) / len(raw), "deflate_mb_s": len(raw) / deflate_s / 1e6,
            "inflate_mb_s": len(raw) / inflate_s / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=7168, help="7168: Kimi-K2.5 / DeepSeek-V3; 4096: Qwen3-8B")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=1024)
    args = parser.parse_args()
    rows = [states(args.tokens, args.hidden, seed) for seed in range(args.rows)]
    with tempfile.TemporaryDirectory() as tmp:
        results = {s: measure(s, rows, Path(tmp) / s) for s in ("bf16", "fp8")}
    bf16, fp8 = results["bf16"], results["fp8"]
    print(f"{args.rows} rows x {args.tokens} tokens, hidden {args.hidden}, 4 stored layers; torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'':28}{'bf16':>14}{'fp8':>14}{'fp8 / bf16':>12}")
    for key, label in (("bytes_per_token", "bytes per token"), ("write_tok_s", "writer tok/s"),
                       ("read_tok_s", "trainer read tok/s"), ("zlib_ratio", "zlib-1 size / raw"),
                       ("deflate_mb_s", "zlib-1 deflate MB/s"), ("inflate_mb_s", "zlib inflate MB/s")):
        print(f"{label:28}{bf16[key]:>14,.3f}{fp8[key]:>14,.3f}{fp8[key] / bf16[key]:>11.3f}x")
    print(f"fp8 round trip: max error {fp8['max_rel_error']:.4f} of each token's largest value (bf16: "
          f"{bf16['max_rel_error']:.4f})")


if __name__ == "__main__":
    main()
