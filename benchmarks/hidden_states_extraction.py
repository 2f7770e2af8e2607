"""Transformers-backend extraction on this CPU against its peers, side by side in one run.

    .venv/bin/python benchmarks/hidden_states_extraction.py [--hidden 576] [--layers 8] [--rows 32]
                                                            [--tokens 512] [--out DIR]

A random-weight Qwen3 of the given width (made here, no download) extracts its states for random
rows through draftsmith's backend and shard store (the GPU check's own ``extract`` step, on the
CPU), then the same batches go through a bare forward pass and the same bytes through a raw write +
fsync in the store's folder. Printed: tok/s of each, and extraction against the forward pass plus
the write one after the other (issue 37's goal on a CPU: at least 0.8x; the two share the cores)
and against the slower of the two (the goal where they overlap, on a GPU: benchmarks/gpu_check.sh).
The model's load is timed apart and not counted.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_check import extract


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="extraction-bench."))
    (out / "steps").mkdir(parents=True, exist_ok=True)
    size = {"hidden": args.hidden, "layers": args.layers, "heads": 8, "vocab": 32000, "rows": args.rows,
            "tokens": args.tokens}
    result = extract(out, "bench", "cpu", size)
    print(json.dumps(result, indent=1))
    print(f"extraction {result['extract_tok_s']:,} tok/s; bare forward {result['bare_forward_tok_s']:,}; raw write "
          f"{result['raw_write_tok_s']:,} ({result['raw_write_gb_s']} GB/s); against forward + write: "
          f"**{result['ratio_vs_forward_plus_write']:.2f}x**; against the slower: {result['ratio']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
