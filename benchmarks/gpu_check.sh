#!/usr/bin/env bash
# The GPU path in one short run (6 min with the machine's start), for the bare GPU machine this project can borrow:
#
#   benchmarks/gpu_check.sh            # on a CUDA machine
#   benchmarks/gpu_check.sh --cpu      # the same steps on the CPU (CI runs this)
#
# It builds a tiny target itself and runs draftsmith's transformers hidden-state backend, speculators
# training under torchrun and the export, each against a peer (a bare forward pass, speculators' own
# loop), and says which parts it could not run there and why (see benchmarks/gpu_check.py).
# Wheels in .whl/ (pure-Python ones: speculators and what the machine lacks) are installed first.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
  echo "gpu_check: installing $(ls .whl/*.whl | wc -l) carried wheels" >&2
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
exec "$PY" benchmarks/gpu_check.py "$@"
