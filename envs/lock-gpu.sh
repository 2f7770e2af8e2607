#!/usr/bin/env bash
# Regenerate the GPU stack's lock (envs/constraints-gpu.txt) after a change to envs/requirements-gpu.txt: one
# universal resolution for Python 3.11 and 3.12 on Linux, from package metadata only (no CUDA wheel is
# downloaded, arctic-inference is not built: envs/uv-gpu.toml). tests/test_gpu_lock.py checks that it resolves.
set -euo pipefail
cd "$(dirname "$0")/.."
envs/setup.sh  # uv comes with the CPU stack
{
  cat <<'HEADER'
# The GPU stack's lock: exact versions of envs/requirements-gpu.txt and all they bring, for Python 3.11 and 3.12
# on Linux (markers where the two differ). Used as constraints by envs/setup-gpu.sh; written by envs/lock-gpu.sh.
HEADER
  .venv/bin/uv pip compile envs/requirements-gpu.txt --universal --python-version 3.11 \
    --config-file envs/uv-gpu.toml --no-annotate --no-header -q
} >envs/constraints-gpu.txt.tmp
mv envs/constraints-gpu.txt.tmp envs/constraints-gpu.txt
