#!/usr/bin/env bash
# Create or update .venv-gpu with the pinned GPU stack: envs/requirements-gpu.txt under its lock
# (envs/constraints-gpu.txt), vLLM's CUDA build and the torch it brings, on Python 3.12 (what vLLM's CUDA images
# carry; 3.11 where there is none). Idempotent: does nothing when .venv-gpu matches these files. Never touches
# .venv (the CPU stack). A CUDA torch imports on a machine without GPUs, so a SLURM login node runs this stack too.
#   DRAFTSMITH_PYTHON   the Python to build .venv-gpu from (one without vLLM; envs/stack.sh uses one with it as is)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-gpu
stamp=$(cat envs/setup-gpu.sh envs/requirements-gpu.txt envs/constraints-gpu.txt envs/uv-gpu.toml \
  envs/build-constraints.txt envs/data-packages.txt pyproject.toml | sha256sum | cut -c1-16)
if [[ -f $VENV/.draftsmith-stamp && $(cat $VENV/.draftsmith-stamp) == "$stamp" ]]; then
  exit 0
fi
if [[ -n ${DRAFTSMITH_PYTHON:-} ]]; then
  PY=$DRAFTSMITH_PYTHON
else
  PY=$(command -v python3.12 || command -v python3.11 || true)
  [[ -n $PY ]] || { echo "draftsmith: no python3.12 or python3.11 found; set DRAFTSMITH_PYTHON to one" >&2; exit 1; }
fi
# Before the ~5 GB download: a driver the CUDA wheels cannot run on is refused (draftsmith/ops/devices.py owns the
# minimum; the module imports nothing outside the standard library).
"$PY" -S -c 'import sys; sys.path.insert(0, "."); from draftsmith.ops import devices; sys.exit(devices.driver_problem())'
echo "draftsmith: setting up $VENV, the GPU stack (several minutes, ~10 GB)" >&2
[[ -x $VENV/bin/python ]] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip --disable-pip-version-check -q install uv==0.13.9
# uv reads no pip configuration: the index pip is pointed at, and the system's certificates (a proxy's). Built from
# source (arctic-inference) against the lock's torch (build-constraints.txt), which uv takes from its cache.
export UV_NATIVE_TLS=1
[[ -n ${PIP_INDEX_URL:-} ]] && export UV_INDEX_URL=${UV_INDEX_URL:-$PIP_INDEX_URL}
[[ -n ${PIP_EXTRA_INDEX_URL:-} ]] && export UV_EXTRA_INDEX_URL=${UV_EXTRA_INDEX_URL:-$PIP_EXTRA_INDEX_URL}
uv=("$VENV/bin/uv" pip install --python "$VENV/bin/python" -q --compile-bytecode --config-file envs/uv-gpu.toml)
"${uv[@]}" -r envs/requirements-gpu.txt -c envs/constraints-gpu.txt --build-constraint envs/build-constraints.txt
"${uv[@]}" --no-deps -r envs/data-packages.txt
"${uv[@]}" --no-deps -e .
echo "$stamp" >$VENV/.draftsmith-stamp
