#!/usr/bin/env bash
# The GPU path, in one short run for the day a GPU machine is lent (one H200, a few minutes, no network).
#
#   benchmarks/gpu_check.sh DATA_DIR        # DATA_DIR: tokenized parquet files (e.g. an e2e run's results/tokenized)
#
# That machine has torch with CUDA and transformers, but no vLLM, speculators or Snakemake: wheels
# carried in .whl/ (see the README, "The GPU path") are installed first. Then the workflow runs from
# the pre-tokenized rows with hidden_states.backend transformers on CUDA and training on CUDA without
# the CPU adaptation, and prints hidden-state tok/s, training tok/s, validation accuracy and whether the
# exported drafter loads. Steps that need no GPU run first (install, config, dry run), so on a CPU
# machine the script shows they are valid and then stops, saying why, with exit code 3.
set -euo pipefail
cd "$(dirname "$0")/.."
data=${1:?usage: benchmarks/gpu_check.sh DATA_DIR (tokenized parquet files)}
PY=${PYTHON:-python3}
work=${GPU_CHECK_WORKDIR:-$(mktemp -d)}
say() { echo "gpu_check: $*" >&2; }

if compgen -G ".whl/*.whl" >/dev/null; then
  say "installing $(ls .whl/*.whl | wc -l) carried wheels"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

config=$work/gpu_check.yaml
"$PY" - "$data" "$config" <<'EOF'
import sys
from pathlib import Path

import yaml

data, out = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
tables = sorted(data.glob("*.parquet"))
if not tables:
    sys.exit(f"gpu_check: no .parquet file in {data}")
out.write_text(yaml.safe_dump({
    "datasets": {t.stem: {"source": str(t), "kind": "tokenized"} for t in tables},
    "hidden_states": {"backend": "transformers", "shard_mb": 64},
    "vocab": {"draft_vocab_size": 2048},
    "train": {"epochs": 2, "total_seq_len": 2048, "gpus": 1, "num_workers": 2},
    "tokenize": {"max_length": 1024},
    "evaluation": {"prompt_sets": {"unused": {"source": str(tables[0])}}},
}))
EOF
# The embedded default (target, server) with these rows and sizes laid over it
snakemake=("$PY" -m snakemake -s "$PWD/Snakefile" -d "$work" --configfile "$PWD/config/config.yaml" "$config" --cores 16
           --resources gpu=1)
"${snakemake[@]}" -n results/train/training.json >"$work/dry_run.log" 2>&1 \
  || { say "dry run failed:"; tail -20 "$work/dry_run.log" >&2; exit 1; }
say "dry run: ok ($(grep -c '^rule \|^localrule ' "$work/dry_run.log") jobs planned), config $config"

if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)"; then
  say "no CUDA device here (torch $("$PY" -c 'import torch; print(torch.__version__)') sees none); the rest needs a GPU"
  exit 3
fi
"$PY" -c "import torch; print('gpu_check: device', torch.cuda.get_device_name(0), 'torch', torch.__version__)" >&2

started=$(date +%s)
"${snakemake[@]}" results/train/training.json >"$work/run.log" 2>&1 \
  || { say "workflow failed:"; tail -40 "$work/run.log" >&2; for f in "$work"/logs/*/*.log "$work"/logs/*.log; do
         [[ -f $f ]] && { echo "== $f" >&2; tail -15 "$f" >&2; }; done; exit 1; }
say "workflow done in $(( $(date +%s) - started )) s"

cd "$work"
"$PY" - <<'EOF'
import csv
import json
import re
from pathlib import Path

manifests = list(Path("results/hidden_states").glob("*/manifest.json"))
tokens = sum(json.loads(m.read_text())["tokens"] for m in manifests)
seconds = sum(float(next(csv.DictReader(open(f"results/timings/hidden_states/{m.parent.name}.tsv"),
                                        delimiter="\t"))["s"]) for m in manifests)
print(f"hidden states: {tokens} tokens in {seconds:.1f} s (job, model load included): {tokens / seconds:.0f} tok/s; "
      f"computed in {json.loads(manifests[0].read_text())['compute']}")
training = json.loads(Path("results/train/training.json").read_text())
rates = [float(r) for r in re.findall(r"'tokens_per_s(?:ec)?': ([0-9.e+]+)", Path("logs/train.log").read_text())]
print(f"training: on_cpu={training['on_cpu']}, compute {training['compute']}, median step tok/s "
      f"{sorted(rates)[len(rates) // 2] if rates else 'not logged'}")
for epoch in training["validation"]:
    print(f"  epoch {epoch['epoch'] + 1}: full_acc_0 {epoch.get('full_acc_0_epoch'):.3f}, "
          f"simulated τ {epoch['simulated_tau']:.3f}")

from draftsmith.export import export_vllm
from speculators.models.eagle3 import Eagle3DraftModel

out = Path("results/drafter")
export_vllm(Path(training["checkpoint"]), out / "final.safetensors", out / "config.json",
            verifier_ref="results/models/smollm2-135m-instruct")
(out / "model.safetensors").symlink_to("final.safetensors")
model = Eagle3DraftModel.from_pretrained(str(out))
print(f"export loads: yes ({sum(p.numel() for p in model.parameters()):,} parameters, "
      f"fc {tuple(model.fc.weight.shape)})")
EOF
