#!/usr/bin/env bash
# SGLang's own loader on the SGLang export (not part of CI): builds SGLang's environment once
# (sglang 0.5.23 brings a CUDA torch: ~11 GB, ~8 min), then runs benchmarks/sglang_load.py.
#   benchmarks/sglang_load.sh [results/drafter/sglang]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${SGLANG_VENV:-.venv-sglang}
if [[ ! -x $venv/bin/python ]] || ! "$venv/bin/python" -c "import sglang" 2>/dev/null; then
  "${DRAFTSMITH_PYTHON:-python3.11}" -m venv "$venv"
  "$venv/bin/python" -m pip install -q sglang==0.5.23
fi
exec "$venv/bin/python" benchmarks/sglang_load.py "$@"
