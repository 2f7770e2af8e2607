#!/usr/bin/env bash
# Command 1 of 2: set up the environment if needed, then run the workflow.
#   ./run.sh                      # embedded default: drafter + benchmark report
#   ./run.sh -n                   # dry run: what remains to be done
#   ./run.sh results/drafter/final.safetensors --configfile my.yaml
set -euo pipefail
cd "$(dirname "$0")"
envs/setup.sh
exec .venv/bin/snakemake "$@"
