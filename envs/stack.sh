#!/usr/bin/env bash
# Which stack runs the workflow on this machine, set up where needed; prints the Python that runs it (./run.sh).
#   DRAFTSMITH_STACK=cpu|gpu   where set; else gpu where `nvidia-smi -L` lists a GPU, else cpu. On SLURM, set it on
#                              the login node: jobs run with the controller's Python, and the GPU stack imports there.
#   DRAFTSMITH_PYTHON          a Python that already carries the stack (a vLLM image's): checked against the pins and
#                              used as it is; a Python without vLLM is the one a venv is built from
#   envs/stack.sh --which      says which stack, sets up nothing
# cpu: .venv (envs/setup.sh); gpu: .venv-gpu (envs/setup-gpu.sh). Neither is ever installed over the other.
set -euo pipefail
cd "$(dirname "$0")/.."
stack=${DRAFTSMITH_STACK:-}
if [[ -z $stack ]]; then
  # read whole, never piped into grep -q: under pipefail, grep leaving at the first GPU line kills nvidia-smi
  # (SIGPIPE) while it writes the next one, and the pipeline's status would pick the CPU stack on a GPU node
  listed=$(nvidia-smi -L 2>/dev/null || true)
  if grep -q '^GPU ' <<<"$listed"; then stack=gpu; else stack=cpu; fi
fi
case $stack in
  cpu | gpu) ;;
  *) echo "draftsmith: DRAFTSMITH_STACK is '$stack'; it takes cpu or gpu" >&2; exit 2 ;;
esac
if [[ ${1:-} == --which ]]; then
  echo "$stack"
  exit 0
fi
if [[ -n ${DRAFTSMITH_PYTHON:-} ]]; then
  rc=0
  "$DRAFTSMITH_PYTHON" -m draftsmith.ops.stack "$stack" >&2 || rc=$?
  if ((rc == 0)); then
    echo "$DRAFTSMITH_PYTHON"
    exit 0
  fi
  ((rc == 3)) || exit 1 # 3: it carries no vLLM, the Python the venv is built from
fi
if [[ $stack == gpu ]]; then
  envs/setup-gpu.sh >&2
  echo "$PWD/.venv-gpu/bin/python"
else
  envs/setup.sh >&2
  echo "$PWD/.venv/bin/python"
fi
