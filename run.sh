#!/usr/bin/env bash
# Command 1 of 2: set up the environment this machine needs (envs/stack.sh: the GPU stack where nvidia-smi lists a
# GPU or DRAFTSMITH_STACK=gpu, else the CPU stack), then run the workflow from it.
#   ./run.sh                      # embedded default: drafter + evaluation report
#   ./run.sh -n                   # dry run: what remains to be done
#   ./run.sh results/drafter/final.safetensors --configfile my.yaml
#   ./run.sh redo hidden_states DATASET   # redo one dataset's hidden states (or: redo answers DATASET)
#   ./run.sh status               # how far a run is (answers, hidden states, training, running jobs)
#   ./run.sh config --configfile my.yaml   # the effective config, each value's origin in a comment
set -euo pipefail
cd "$(dirname "$0")"
python=$(envs/stack.sh)
# Snakemake's --configfile takes every value up to the next flag: a target after it (a result) would be
# read as a config file and fail with a traceback. Targets there are moved before it, the order
# Snakemake needs; a value after it that is no file is refused.
after_configfile=0
targets=()
rest=()
for arg in "$@"; do
  case $arg in
    --configfile | --configfiles) after_configfile=1 ;;
    -*) after_configfile=0 ;;
    *) if ((after_configfile)) && [[ $arg == results/* ]]; then
      targets+=("$arg")
      continue
    elif ((after_configfile)) && [[ ! -f $arg ]]; then
      echo "draftsmith: '$arg' follows --configfile but is no config file (and no target under results/)" >&2
      exit 2
    fi ;;
  esac
  rest+=("$arg")
done
set -- "${targets[@]}" "${rest[@]}"
case ${1:-} in
  redo | status) module=draftsmith.ops.$1 ;;
  config) module=draftsmith.config.load ;;
  *) exec "$python" -m snakemake "$@" ;;
esac
shift
exec "$python" -m "$module" "$@"
