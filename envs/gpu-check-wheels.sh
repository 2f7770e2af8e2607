#!/usr/bin/env bash
# The wheels benchmarks/gpu_check.sh needs on the bare GPU machine (Python 3.12, manylinux x86_64,
# torch/transformers/numpy/pyarrow/pandas/safetensors/triton/accelerate already there), into .whl/:
#   envs/gpu-check-wheels.sh            # then carry .whl (gpu_check.sh installs it first)
# The set the last run on the lent H200 needed (26 wheels, ~9 MB), plus xxhash for the shard checksums and
# attrs, which jsonschema and referencing import (draftsmith's config loader imports jsonschema).
# Compiled cp312 wheels (pydantic_core, rpds-py, jiter, xxhash) carry fine.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.whl}
mkdir -p "$dest"
# Kept out of git where this is a checkout (a release tarball or a copied folder has no .git).
if [[ -d .git/info ]]; then
  grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
fi
names=(speculators hs-connectors datasets dill multiprocess loguru pydantic pydantic_core pydantic-settings
  python-dotenv typing-inspection annotated-types openai httpx2 httpcore2 truststore h11 anyio idna jiter distro
  sniffio jsonschema jsonschema-specifications referencing rpds-py attrs xxhash)
# The versions the CPU stack pins (envs/constraints-cpu.txt), where it has the package: one set that works
# together (pydantic pins its pydantic_core exactly). openai 3.57.0: 3.60 needs httpx2 as well.
pins=()
for name in "${names[@]}"; do
  pin=$(grep -i "^${name//[-_]/[-_]}==" envs/constraints-cpu.txt || true)
  [[ $name == openai ]] && pin=openai==3.57.0
  pins+=("${pin:-$name}")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$dest" "${pins[@]}"
echo "gpu-check-wheels: $(ls "$dest"/*.whl | wc -l) wheels, $(du -sh "$dest" | cut -f1) in $dest" >&2
