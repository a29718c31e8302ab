#!/usr/bin/env bash
# tests/cli/test_cli.sh - the `slapo` command's exit codes (0 ok, 1 error,
# 2 usage) and messages ("slapo: <status>: <message>" on stderr), plus one
# tiny successful training run with a metrics file.
# Usage: test_cli.sh path/to/slapo
set -u

SLAPO=${1:?usage: test_cli.sh path/to/slapo}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
HARNESS_NAME=test_cli
source "$(dirname "$0")/harness.sh"

TEXT="$TMP/corpus.txt"
for i in $(seq 40); do
  echo "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins."
done >"$TEXT"
: >"$TMP/empty.txt"
printf 'definitely not safetensors' >"$TMP/bad.safetensors"

# Usage errors: exit 2.
run "no args" 2 "$SLAPO"
check "no args" err "usage: slapo <command>"
run "unknown command" 2 "$SLAPO" frobnicate
check "unknown command" err "unknown command 'frobnicate'"
run "unknown option" 2 "$SLAPO" train --bogus
check "unknown option" err "--bogus"
run "bad number" 2 "$SLAPO" train --steps abc
check "bad number" err "bad value 'abc'"
run "negative number" 2 "$SLAPO" train --batch -3
check "negative number: what is expected" err "--batch: bad value '-3'; expected an integer >= 1"
run "missing value" 2 "$SLAPO" train --steps
ok "missing value"
run "integer overflow" 2 "$SLAPO" train --steps 99999999999999999999
check "integer overflow" err "bad value '99999999999999999999'"
run "float overflow" 2 "$SLAPO" train --lr 1e999
check "float overflow" err "bad value '1e999'"
run "nan" 2 "$SLAPO" train --weight-decay nan
ok "nan"
run "int range" 2 "$SLAPO" train --top-k 4294967297
ok "int range"
run "stray argument" 2 "$SLAPO" train extra
check "stray argument" err "unexpected argument 'extra'"
run "unknown model" 2 "$SLAPO" train --model t5
check "unknown model" err "unknown model 't5'"
run "show bad option" 2 "$SLAPO" show --nope
ok "show bad option"

# Errors from the library: exit 1, "slapo: <status>: <message>".
run "unknown config" 2 "$SLAPO" train --config gpt5
check "unknown config" err "slapo: usage: gpt2: unknown config 'gpt5'"
lacks_out=$(grep -c "slapo train:" "$OUT" || true)
if [ "$lacks_out" -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL unknown config: header printed before the usage error"; fi
run "show unknown config" 2 "$SLAPO" show --config gpt5
check "show unknown config" err "slapo: usage: gpt2: unknown config 'gpt5'"
run "zero memory limit" 1 env SLAPO_MEMORY_LIMIT=0 "$SLAPO" train --config tiny --steps 1 --data "$TEXT"
check "zero memory limit" err "SLAPO_MEMORY_LIMIT=0: expected a positive number"
run "missing data" 1 "$SLAPO" train --config tiny --seq 8 --data /nonexistent/corpus.txt
check "missing data" err "/nonexistent/corpus.txt"
check "missing data status" err "slapo: io: "
run "empty data" 1 "$SLAPO" train --config tiny --seq 8 --data "$TMP/empty.txt"
check "empty data" err "is empty"
head -c 60 "$TEXT" >"$TMP/small.txt"
run "short validation split" 1 "$SLAPO" train --config tiny --seq 8 --data "$TMP/small.txt"
check "short validation split" err "slapo: invalid_arg: train: the validation split"
run "malformed resume" 1 "$SLAPO" train --config tiny --seq 8 --steps 1 --data "$TEXT" \
  --resume "$TMP/bad.safetensors"
check "malformed resume" err "safetensors"
check "malformed resume status" err "slapo: io: "
run "seq too long" 1 "$SLAPO" train --config tiny --seq 100000 --data "$TEXT"
check "seq too long" err "exceeds the tiny context of 64"
run "metrics unwritable" 1 "$SLAPO" train --config tiny --seq 8 --steps 1 --data "$TEXT" \
  --metrics /nonexistent/m.jsonl --sample 0
check "metrics unwritable" err "/nonexistent/m.jsonl"
# A checkpoint path that is not a file is refused before training: the
# atomic rename would replace a directory entry, a device or a FIFO.
run "save over a directory" 1 "$SLAPO" train --config tiny --seq 8 --steps 1 --data "$TEXT" \
  --save "$TMP" --sample 0
check "save over a directory" err "train: checkpoint: $TMP is a directory; give the path of a file"
lacks "save over a directory: no step ran" out "^step"
mkfifo "$TMP/fifo"
run "save over a FIFO" 1 "$SLAPO" train --config tiny --seq 8 --steps 1 --data "$TEXT" \
  --save "$TMP/fifo" --sample 0
check "save over a FIFO" err "$TMP/fifo is a FIFO"
if [ -p "$TMP/fifo" ]; then passed=$((passed + 1)); else
  failed=$((failed + 1)); echo "FAIL save over a FIFO: the FIFO was replaced"; fi
# A checkpoint path under a regular file (afile/ckpt) is refused before the
# first step, as a read-only directory is, naming both; the file is left as
# it was.
printf 'keep me' >"$TMP/afile"
run "save under a file" 1 "$SLAPO" train --config tiny --seq 8 --steps 1 --data "$TEXT" \
  --save "$TMP/afile/ckpt.safetensors" --sample 0
check "save under a file" err "train: checkpoint: cannot write $TMP/afile/ckpt.safetensors: $TMP/afile is a regular file, not a directory"
lacks "save under a file: no step ran" out "^step"
if [ "$(cat "$TMP/afile")" = "keep me" ]; then passed=$((passed + 1)); else
  failed=$((failed + 1)); echo "FAIL save under a file: the file changed"; fi
# A metrics write that fails (a full disk) ends the run with the file named.
run "metrics write fails" 1 "$SLAPO" train --config tiny --seq 8 --steps 1 --data "$TEXT" \
  --metrics /dev/full --sample 0
check "metrics write fails" err "writing the metrics file /dev/full failed at step 1"

# Help and show: exit 0 on stdout.
run "help" 0 "$SLAPO" help
check "help" out "commands:"
run "version" 0 "$SLAPO" version
check "version" out "slapo "
run "train help" 0 "$SLAPO" train --help
check "train help" out "usage: slapo train"
check "train help steps default" out "optimizer steps [300]"
check "train help config default" out "[small]"
check "train help seed default" out "[1337]"
run "show tiny" 0 "$SLAPO" show --config tiny
check "show tiny" out "GPT2LMHeadModel"
check "show tiny total" out "total: "

# A tiny successful run.
M="$TMP/metrics.jsonl"
run "tiny train" 0 "$SLAPO" train --config tiny --steps 2 --batch 1 --seq 8 --sample 5 \
  --val-batches 1 --threads 1 --data "$TEXT" --metrics "$M" --save "$TMP/ckpt.safetensors"
check "tiny train config line" out "slapo train: model=gpt2 config=tiny"
check "tiny train val loss" out "val_loss"
check "tiny train sample" out "sample"
check "tiny train saved" out "saved $TMP/ckpt.safetensors at step 2"
if [ -s "$TMP/ckpt.safetensors" ] && [ -s "$TMP/ckpt.optim.safetensors" ]; then
  passed=$((passed + 1))
else
  failed=$((failed + 1))
  echo "FAIL tiny train: checkpoint files missing"
fi
# Metrics: one JSON object a line with step, loss, lr, tokens_per_s.
lines=$(wc -l <"$M" 2>/dev/null || echo 0)
good=$(grep -cE '^\{"step": [0-9]+, "loss": [-0-9.e+]+, "lr": [-0-9.e+]+, .*"tokens_per_s": [-0-9.e+]+\}$' "$M" 2>/dev/null || echo 0)
if [ "$lines" -eq 2 ] && [ "$good" -eq 2 ] && grep -q '"step": 2,' "$M"; then
  passed=$((passed + 1))
else
  failed=$((failed + 1))
  echo "FAIL metrics: $lines lines, $good well-formed: $(cat "$M" 2>/dev/null)"
fi
if command -v python3 >/dev/null 2>&1; then
  if python3 -c 'import json,sys
for l in open(sys.argv[1]):
    o = json.loads(l)
    assert all(k in o for k in ("step", "loss", "lr", "grad_norm", "tokens_per_s")), o' "$M"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAIL metrics: not JSON lines"
  fi
fi
# The model registry: every family with its configs and parameter counts;
# the same names in show/verify; the family's default schedule by name.
run "models" 0 "$SLAPO" models
check "models: family" out "gpt2 (GPT2LMHeadModel)"
check "models: 124M count" out "124.44M parameters"
check "models: 1.5B on meta" out "1557.61M parameters"
run "verify unknown model" 2 "$SLAPO" verify --model t5 --schedule x.sched
check "verify unknown model" err "unknown model 't5' (known: gpt2, llama"
# BERT: the masked-LM family through the same registry; bert-base-uncased's
# shape on meta tensors (BertForMaskedLM without pooler, counted by torch in
# tools/gen_bert_fixture.py), and a tiny masked-LM run that skips sampling.
run "models (bert)" 0 "$SLAPO" models
check "models: bert" out "bert (BertForMaskedLM)"
check "models: bert base" out "109.51M parameters  12 layers, 768 wide, 12 heads, context 512, vocabulary 30522"
run "show bert base" 0 "$SLAPO" show --model bert --config base
check "show bert base" out "total: 109514298 parameters"
check "show bert base: no sampling window" out "sampling window 0.0"
run "train bert" 0 "$SLAPO" train --model bert --config tiny --steps 2 --batch 1 --seq 16 \
  --val-every 1 --val-batches 1 --threads 1 --data "$TEXT"
check "train bert: objective" out "objective: masked LM: 15 % of positions chosen"
check "train bert: no sample" out "sample: skipped: bert trains a masked LM"
run "show default schedule" 0 "$SLAPO" show --config tiny --schedule default
check "show default schedule" out "gpt2.sched: 28 steps"
run "models extra arg" 2 "$SLAPO" models now
check "models extra arg" err "unexpected argument 'now'"
# The memory estimate: printed by show (meta tensors: 1.5B costs nothing);
# train refuses a run that does not fit, before allocating, with the
# breakdown and the available figure.
run "show memory" 0 "$SLAPO" show --config 1.5B
check "show memory" out "training memory (batch 4 x seq 256, estimated): weights 5941.8 MiB"
run "train too big" 1 env SLAPO_MEMORY_LIMIT=24G "$SLAPO" train --config 1.5B --steps 1 \
  --data "$TEXT"
check "train too big" err "slapo: limit: train: gpt2 1.5B at batch 4 x seq 256 needs an estimated"
check "train too big: available" err "24576.0 MiB are available (SLAPO_MEMORY_LIMIT)"
check "train too big: breakdown" err "AdamW state 11883.6 MiB"
run "train fits" 0 env SLAPO_MEMORY_LIMIT=1G "$SLAPO" train --config tiny --steps 1 --batch 1 \
  --seq 8 --sample 0 --val-batches 1 --data "$TEXT"
check "train fits" out "of 1024.0 MiB available"
run "bad memory limit" 1 env SLAPO_MEMORY_LIMIT=lots "$SLAPO" train --config tiny --steps 1 \
  --batch 1 --seq 8 --data "$TEXT"
check "bad memory limit" err "SLAPO_MEMORY_LIMIT=lots: expected a positive number of bytes"
# The loss plot, from the metrics file of a run.
# Byte text on a BPE-sized vocabulary gets a note (the memory limit stops
# the run right after, before any weights are made).
SLAPO_MEMORY_LIMIT=1M run "bytes on 124M" 1 "$SLAPO" train --config 124M --steps 1 --seq 8 --data "$TEXT"
check "bytes on 124M" out "holds ids below 256 (text is read as bytes) but gpt2 124M has a vocabulary of 50257"
run "save-every needs save" 1 "$SLAPO" train --config tiny --steps 1 --save-every 10 --data "$TEXT"
check "save-every needs save" err "--save-every 10 needs --save FILE"
run "plot needs metrics" 1 "$SLAPO" train --config tiny --steps 1 --plot "$TMP/x.svg" --data "$TEXT"
check "plot needs metrics" err "--plot $TMP/x.svg needs --metrics FILE"
run "train --plot" 0 "$SLAPO" train --config tiny --steps 4 --batch 1 --seq 8 --sample 0 \
  --val-every 2 --val-batches 1 --threads 1 --data "$TEXT" --metrics "$TMP/p.jsonl" --plot "$TMP/p.svg"
check "train --plot" out "plot: $TMP/p.svg"
run "slapo plot" 0 "$SLAPO" plot "$TMP/p.jsonl" --output "$TMP/q.svg"
check "slapo plot" out "plot: wrote $TMP/q.svg"
if cmp -s "$TMP/p.svg" "$TMP/q.svg" && grep -q '<polyline class="val_loss"' "$TMP/q.svg"; then
  passed=$((passed + 1))
else
  failed=$((failed + 1))
  echo "FAIL plot: train --plot and slapo plot differ, or no val_loss curve"
fi
run "plot no file" 2 "$SLAPO" plot
check "plot no file" err "a metrics file is required"
# The ISA cap: a bad value is an error before anything runs; a good one is
# obeyed and named in the start-up line.
run "bad isa cap" 1 env SLAPO_MAX_ISA=avx9000 "$SLAPO" show --config tiny
check "bad isa cap" err "slapo: invalid_arg: SLAPO_MAX_ISA=avx9000: expected baseline, avx2, avx512 or avx512_bf16"
run "isa cap" 0 env SLAPO_MAX_ISA=baseline "$SLAPO" train --config tiny --steps 1 --batch 1 --seq 8 \
  --sample 0 --val-batches 1 --threads 1 --data "$TEXT"
check "isa cap" out "slapo kernels baseline"
# --precision: a bad value is a usage error; bf16 where the GEMMs cannot run
# in bf16 (capped at avx2 here, whatever the host) says so and trains in
# f32; verify and show take it as the root autocast line.
run "bad precision" 2 "$SLAPO" train --precision f16
check "bad precision" err "--precision: bad value 'f16'; expected f32 or bf16"
run "bf16 without bf16 units" 0 env SLAPO_MAX_ISA=avx2 "$SLAPO" train --config tiny --steps 1 \
  --batch 1 --seq 8 --sample 0 --val-batches 1 --threads 1 --data "$TEXT" --precision bf16
check "bf16 without bf16 units" err "--precision bf16: "
check "bf16 without bf16 units: the fallback" err "running in f32 instead"
run "verify bf16" 0 "$SLAPO" verify --config tiny --precision bf16 --final-only --seq 8
check "verify bf16" out "bf16 GEMMs: "
check "verify bf16: the parts" out "bf16 vs emulated 0"
check "verify bf16: verdict" out "verify: ok"
# oneDNN capped below bf16 (on any host): the bf16 GEMMs are widened, and
# verify still checks the bf16 numerics.
run "verify bf16, oneDNN capped" 0 env ONEDNN_MAX_CPU_ISA=AVX2 "$SLAPO" verify --config tiny \
  --precision bf16 --final-only --seq 8
check "verify bf16, oneDNN capped" out "bf16 GEMMs: widened to f32 here: "
check "verify bf16, oneDNN capped: verdict" out "verify: ok"
run "show bf16" 0 "$SLAPO" show --config tiny --precision bf16 --schedule none
check "show bf16" out "schedule --precision bf16: 1 step"
check "show bf16: its source" out "# --precision bf16:1"
# GPT-2 1.5B's estimate on meta tensors: AdamW's m and v take 4 bytes a
# parameter in bf16 (5,941.8 MiB) instead of 8 (11,883.6 MiB).
run "bad optimizer state" 2 "$SLAPO" train --optimizer-state f16
check "bad optimizer state" err "--optimizer-state: bad value 'f16'; expected f32 or bf16"
run "1.5B estimate f32 state" 0 "$SLAPO" show --config 1.5B --batch 1 --seq 256 --schedule none
check "1.5B estimate f32 state" out "AdamW state 11883.6 MiB"
run "1.5B estimate bf16 state" 0 "$SLAPO" show --config 1.5B --batch 1 --seq 256 --schedule none \
  --precision bf16 --optimizer-state bf16
check "1.5B estimate bf16 state" out "weights 5941.8 MiB + gradients 5941.8 MiB + AdamW state 5941.8 MiB"
# Resuming the finished run continues its metrics file.
run "resume" 0 "$SLAPO" train --config tiny --steps 3 --batch 1 --seq 8 --sample 0 \
  --val-batches 1 --threads 1 --data "$TEXT" --metrics "$M" --resume "$TMP/ckpt.safetensors"
check "resume" out "resume: $TMP/ckpt.safetensors at step 2"
if [ "$(wc -l <"$M")" -eq 3 ] && tail -n 1 "$M" | grep -q '"step": 3,'; then
  passed=$((passed + 1))
else
  failed=$((failed + 1))
  echo "FAIL resume metrics: $(cat "$M")"
fi
# Weights and optimizer state from different saves (a save interrupted
# between its two files) are refused, naming both steps.
run "save step 1" 0 "$SLAPO" train --config tiny --steps 1 --batch 1 --seq 8 --sample 0 \
  --val-batches 1 --threads 1 --data "$TEXT" --save "$TMP/one.safetensors"
cp "$TMP/ckpt.safetensors" "$TMP/mix.safetensors"
cp "$TMP/one.optim.safetensors" "$TMP/mix.optim.safetensors"
run "resume mixed pair" 1 "$SLAPO" train --config tiny --steps 3 --batch 1 --seq 8 --sample 0 \
  --val-batches 1 --threads 1 --data "$TEXT" --resume "$TMP/mix.safetensors"
check "resume mixed pair" err "holds the weights of step 2 but $TMP/mix.optim.safetensors the optimizer state of step 1"
# A checkpoint of another model or config; both --resume and --init-from;
# weights saved under an optimizer file's name (they would overwrite it).
run "resume another config" 1 "$SLAPO" train --config small --steps 3 --batch 1 --seq 8 --sample 0 \
  --val-batches 1 --threads 1 --data "$TEXT" --resume "$TMP/ckpt.safetensors"
check "resume another config" err "ckpt.safetensors was saved from gpt2 tiny; this run is gpt2 small"
run "resume and init-from" 1 "$SLAPO" train --config tiny --steps 3 --data "$TEXT" \
  --resume "$TMP/ckpt.safetensors" --init-from "$TMP/one.safetensors"
check "resume and init-from" err "both set the weights; give one"
run "save as an optimizer file" 1 "$SLAPO" train --config tiny --steps 1 --data "$TEXT" \
  --save "$TMP/ckpt.optim.safetensors"
check "save as an optimizer file" err "ends in .optim.safetensors, the name of a checkpoint's optimizer file"
run "init-from" 0 "$SLAPO" train --config tiny --steps 1 --batch 1 --seq 8 --sample 0 \
  --val-batches 1 --threads 1 --data "$TEXT" --init-from "$TMP/ckpt.safetensors"
check "init-from" out "init: weights from $TMP/ckpt.safetensors"
# An llm.c token file holds GPT-2 ids: another family is told so.
perl -e 'print pack("l<256", 20240520, 1, 400, (0) x 253), pack("S<400", map { $_ * 3 % 250 } 0 .. 399)' \
  > "$TMP/gpt2_ids.bin"
run "llm.c file into bert" 0 "$SLAPO" train --model bert --config tiny --steps 1 --batch 1 --seq 8 \
  --val-batches 1 --threads 1 --data "$TMP/gpt2_ids.bin"
check "llm.c file into bert" out "is an llm.c token file of GPT-2 token ids; bert reads them as ids of its own vocabulary"
run "init-from another family" 1 "$SLAPO" train --model llama --config tiny --steps 1 \
  --data "$TEXT" --init-from "$TMP/ckpt.safetensors"
check "init-from another family" err "ckpt.safetensors was saved from gpt2 tiny; this run is llama tiny"

# slapo profile: the per-module table with its header, the optimizer row and
# a total row; bad values are usage errors.
run "profile" 0 "$SLAPO" profile --config tiny --steps 2
check "profile header" out "act MiB: planned activation buffers alive at the step's live"
check "profile row" out "transformer.h.0.attn"
check "profile optimizer" out "optimizer (AdamW)"
check "profile total" out "total (measured step)"
run "profile compare" 2 "$SLAPO" profile --config tiny --compare only_one.sched
check "profile compare" err "--compare wants two schedules A,B"
# --compare takes each side as --schedule does ('default' was read as a
# file); a module only A has gets '-' for B/A (it printed 0.00x).
run "profile compare default,none" 0 "$SLAPO" profile --config tiny --steps 1 --depth 3 \
  --compare default,none
check_re "profile compare default,none: names" out "compare A=.*/gpt2\.sched B=none "
check "profile compare default,none: legend" out "B/A (- : A or B has none)"
check_re "profile compare: B has none" out "^transformer\.h\.0\.FusedBiasGeLU_0 .*\| +- +-$"
lacks "profile compare: no 0.00x" out "Fused[A-Za-z]+_[0-9]+ .*0\.00x"
run "profile compare ,default" 0 "$SLAPO" profile --config tiny --steps 1 --compare ,default
check_re "profile compare ,default: names" out "compare A=none B=.*/gpt2\.sched "
run "show schedule none" 0 "$SLAPO" show --config tiny --schedule none
lacks "show schedule none: no steps" out "^schedule "
run "verify schedule none" 2 "$SLAPO" verify --config tiny --schedule none
check "verify schedule none" err "--schedule none leaves nothing to verify"
run "profile steps" 2 "$SLAPO" profile --config tiny --steps 0
check "profile steps" err "--steps: bad value '0'"
run "profile seq" 1 "$SLAPO" profile --config tiny --seq 65
check "profile seq" err "exceeds the tiny context of 64"

# Tokenizers: learn one, reload it to tokenize, llm.c's token file, errors.
run "tokenizer train" 0 "$SLAPO" tokenizer train --vocab-size 300 --output "$TMP/tok.json" "$TEXT"
check_re "tokenizer train: report" out "tokenizer train: 3320 bytes of text, 300 tokens \\(2 special\\) in .* s; the text is [0-9]+ tokens"
if grep -q '"type": "BPE"' "$TMP/tok.json"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL tokenizer train: no BPE model in $TMP/tok.json"; fi
run "tokenize trained" 0 "$SLAPO" tokenize --tokenizer "$TMP/tok.json" --output "$TMP/tok.bin" "$TEXT"
check_re "tokenize trained: report" out "tokenize: 3320 bytes of text, [0-9]+ tokens"
run "tokenize gpt2" 0 "$SLAPO" tokenize --output "$TMP/gpt2.bin" "$TEXT"
check "tokenize gpt2: tokens" out "tokenize: 3320 bytes of text, 761 tokens (4.36 bytes a token)"
run "gpt2 token file on tiny" 1 "$SLAPO" train --config tiny --steps 1 --seq 16 --batch 2 --sample 0 --data "$TMP/gpt2.bin"
check "gpt2 token file on tiny" err "has token ids up to 50256 but the tiny config's vocabulary is 256"
run "tokenizer train no vocab" 2 "$SLAPO" tokenizer train "$TEXT"
check "tokenizer train no vocab" err "--vocab-size is required"
run "tokenizer train small vocab" 2 "$SLAPO" tokenizer train --vocab-size 100 "$TEXT"
check "tokenizer train small vocab" err "--vocab-size: bad value '100'"
run "tokenizer train no file" 2 "$SLAPO" tokenizer train --vocab-size 300
check "tokenizer train no file" err "name at least one text FILE"
run "tokenizer bad subcommand" 2 "$SLAPO" tokenizer frob
check "tokenizer bad subcommand" err "unknown subcommand"
run "tokenizer train missing file" 1 "$SLAPO" tokenizer train --vocab-size 300 --output "$TMP/x.json" /nonexistent/text
check "tokenizer train missing file" err "/nonexistent/text"
printf '{"model": {"type": "WordPiece", "vocab": {}}}' >"$TMP/wp.json"
run "tokenize unsupported" 1 "$SLAPO" tokenize --tokenizer "$TMP/wp.json" --output "$TMP/wp.bin" "$TEXT"
check "tokenize unsupported" err "unsupported tokenizer model WordPiece"
run "tokenize no output" 2 "$SLAPO" tokenize "$TEXT"
check "tokenize no output" err "--output is required"
run "tokenizer encode" 0 "$SLAPO" tokenizer encode "Hello, world!" "x<|endoftext|>y"
check "tokenizer encode: ids" out "4 tokens: 15496 11 995 0"
check "tokenizer encode: pieces" out "|Hello|,| world|!|"
lacks "tokenizer encode: no special unasked" out " 50256"
run "tokenizer encode special" 0 "$SLAPO" tokenizer encode --special "x<|endoftext|>y"
check "tokenizer encode special" out "3 tokens: 87 50256 88"
run "tokenizer encode no text" 2 "$SLAPO" tokenizer encode
check "tokenizer encode no text" err "give a TEXT to encode"

# train --tokenizer: a BPE learned on the training split, nats per byte,
# samples decoded; a checkpoint remembers its tokenizer.
run "train bpe" 0 "$SLAPO" train --config tiny --steps 3 --batch 2 --seq 32 --tokenizer bpe:300 \
  --data "$TEXT" --sample 8 --save "$TMP/bpe.safetensors" --metrics "$TMP/bpe.jsonl"
check_re "train bpe: learned" out "tokenizer: learned bpe:300, 300 tokens; 3320 bytes of text to [0-9]+ tokens"
check "train bpe: vocabulary" out "vocabulary: gpt2 tiny takes the tokenizer's 300 ids, padded to 384"
check_re "train bpe: nats per byte" out "val_nats_per_byte [0-9.]+"
check "train bpe: metrics" "$TMP/bpe.jsonl" '"val_nats_per_byte": '
run "resume without the tokenizer" 1 "$SLAPO" train --config tiny --steps 4 --batch 2 --seq 32 \
  --data "$TEXT" --sample 0 --resume "$TMP/bpe.safetensors"
check "resume without the tokenizer" err "was trained with tokenizer bpe:300"
run "resume with it" 0 "$SLAPO" train --config tiny --steps 4 --batch 2 --seq 32 --tokenizer bpe:300 \
  --data "$TEXT" --sample 0 --resume "$TMP/bpe.safetensors"
check "resume with it" out "resume: $TMP/bpe.safetensors at step 3"
run "fixed vocabulary refuses" 1 "$SLAPO" train --model llama --config 1.1B --steps 1 --seq 16 \
  --tokenizer gpt2 --data "$TEXT"
check "fixed vocabulary refuses" err "has 50257 ids but llama 1.1B has a vocabulary of 32000"
run "bert with a learned bpe" 0 "$SLAPO" train --model bert --config tiny --steps 2 --seq 16 \
  --batch 2 --tokenizer bpe:300 --data "$TEXT"
check "bert with a learned bpe" out "[MASK] is its <|mask|>, id 257"
run "bert with gpt2's bpe" 1 "$SLAPO" train --model bert --config tiny --steps 1 --seq 16 \
  --tokenizer gpt2 --data "$TEXT"
check "bert with gpt2's bpe" err "has no <|mask|> token for [MASK]"
run "bad bpe size" 1 "$SLAPO" train --config tiny --steps 1 --seq 16 --tokenizer bpe:10 --data "$TEXT"
check "bad bpe size" err "a learned BPE needs 258 to 1048576 tokens"
run "tokenizer on a token file" 0 "$SLAPO" train --config tiny --steps 1 --seq 16 --batch 2 \
  --tokenizer "$TMP/tok.json" --data "$TMP/tok.bin" --sample 4
check "tokenizer on a token file" out "decodes the token file's samples"

summary
