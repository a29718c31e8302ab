#!/usr/bin/env bash
# tools/gen_spm_fixture.sh - a small SentencePiece model and its golden ids
# for tests/unit/test_tokenizer_spm.c: spm_train (Debian's sentencepiece
# package; BPE with byte fallback and no normalization, as LLaMA's
# tokenizer.model; rare characters (2 %) left to bytes) learns 600
# pieces on the texts of the GPT-2 goldens, and spm_encode writes the ids of
# every one of those texts, one line each (tab-free texts, on one line).
# Run from anywhere; commit what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
out=tests/data/tokenizer/spm
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$out"
python3 - tests/data/tokenizer/gpt2_golden.jsonl "$tmp/texts.txt" <<'PY'
import json, sys
seen = []
for line in open(sys.argv[1], encoding="utf-8"):
    t = json.loads(line)["text"]
    if t and "\n" not in t and "\r" not in t and "\t" not in t and "\x00" not in t and t not in seen:
        seen.append(t)
open(sys.argv[2], "w", encoding="utf-8").write("\n".join(seen) + "\n")
PY
spm_train --input="$tmp/texts.txt" --model_prefix="$tmp/tiny" --model_type=bpe --vocab_size=600 \
  --byte_fallback=true --character_coverage=0.98 --normalization_rule_name=identity \
  --num_threads=1 --minloglevel=2 >/dev/null 2>&1
cp "$tmp/tiny.model" "$out/tiny.model"
cp "$tmp/texts.txt" "$out/texts.txt"
spm_encode --model="$out/tiny.model" --output_format=id < "$out/texts.txt" > "$out/ids.txt"
echo "gen_spm_fixture: wrote $out/{tiny.model,texts.txt,ids.txt} ($(wc -l < "$out/texts.txt") texts)"
