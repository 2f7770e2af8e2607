#!/usr/bin/env bash
# Command 1 of 2: set up the environment if needed, then run the workflow.
#   ./run.sh                      # embedded default: drafter + evaluation report
#   ./run.sh -n                   # dry run: what remains to be done
#   ./run.sh results/drafter/final.safetensors --configfile my.yaml
#   ./run.sh redo hidden_states DATASET   # redo one dataset's hidden states (or: redo answers DATASET)
#   ./run.sh status               # how far a run is (answers, hidden states, training, running jobs)
#   ./run.sh config --configfile my.yaml   # the effective config, each value's origin in a comment
set -euo pipefail
cd "$(dirname "$0")"
envs/setup.sh
case ${1:-} in
  redo | status) module=draftsmith.ops.$1 ;;
  config) module=draftsmith.config.load ;;
  *) exec .venv/bin/snakemake "$@" ;;
esac
shift
exec .venv/bin/python -m "$module" "$@"
