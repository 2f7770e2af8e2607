#!/usr/bin/env bash
# The GPU stack's install rehearsed on a CPU machine, as ./run.sh sets it up on a GPU node: a fresh clone,
# DRAFTSMITH_STACK=gpu (a node's nvidia-smi would choose it), .venv-gpu from envs/setup-gpu.sh, then the stack
# imported under its CUDA torch and the workflow's dry run from it. Downloads ~5 GB: not in CI.
#   benchmarks/gpu_install.sh [WORKDIR]          # default: a new temporary folder; prints time, size, versions
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$(mktemp -d)}
git clone -q "$repo" "$work/draftsmith"
cd "$work/draftsmith"
export DRAFTSMITH_STACK=gpu
start=$(date +%s)
python=$(envs/stack.sh)
installed=$(date +%s)
echo "set-up: $((installed - start)) s, $(du -sh .venv-gpu | cut -f1) in .venv-gpu, $python"
"$python" - <<'PY'
import importlib.metadata as m, sys
import torch, vllm, speculators, transformers, snakemake, draftsmith  # noqa: F401  (imports are the check)
print(f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}), vllm {vllm.__version__}, "
      f"speculators {m.version('speculators')}, transformers {transformers.__version__}, snakemake "
      f"{m.version('snakemake')}, arctic-inference {m.version('arctic-inference')}")
PY
./run.sh -n --quiet rules
./run.sh config --configfile config/examples/qwen3_32b_node.yaml >/dev/null
echo "dry run and config from .venv-gpu: $(($(date +%s) - installed)) s"
