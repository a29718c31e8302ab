#!/usr/bin/env bash
# tests/cli/test_cli_dist.sh - `slapo` under mpirun: tensor-parallel verify
# of schedules/gpt2_tp.sched (2 ranks; 4 ranks as TP 2 x DP 2), training with
# TP 2 matching one process exactly, a gathered checkpoint resumed at
# another TP size, a world size the schedule or the model cannot use (6
# heads over 4 ranks), a failing rank ending the whole job within 30 s
# with its "slapo: rank R:" message, and dropout under tensor parallelism
# (every family's TP schedule and its composite-attention variant, dropout
# 0.1, and a training run equal to one process's to 1e-6).
# Usage: test_cli_dist.sh path/to/slapo path/to/repo
set -u

SLAPO=${1:?usage: test_cli_dist.sh path/to/slapo path/to/repo}
ROOT=${2:?usage: test_cli_dist.sh path/to/slapo path/to/repo}
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="mpirun --oversubscribe"
TP_SCHED="$ROOT/schedules/gpt2_tp.sched"
HARNESS_NAME=test_dist
RUN_TIMEOUT=${RUN_TIMEOUT:-120}
source "$(dirname "$0")/harness.sh"
TEXT="$TMP/corpus.txt"
for i in $(seq 60); do
  echo "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins."
done >"$TEXT"

run "verify tp2" 0 $MPIRUN -np 2 "$SLAPO" verify --tp 2 --schedule "$TP_SCHED" --final-only
check "verify tp2 layout" out "distributed: world 2 = tp 2 x dp 1"
check "verify tp2 ok" out "verify: ok"
# Step by step (the README's command): the steps from the first shard to
# the last sync are checked together; the others one by one.
run "verify tp2 per step" 0 $MPIRUN -np 2 "$SLAPO" verify --tp 2 --schedule "$TP_SCHED"
check "verify tp2 per step ok" out "verify: ok"
check "verify tp2 per step: the TP part" out "shard the model for tensor parallelism and are checked together"
check_re "verify tp2 per step: the fuse steps" out "steps 1-[0-9]+ \(last: .*fuse\): within tolerance"
run "verify tp2 small" 0 $MPIRUN -np 2 "$SLAPO" verify --tp 2 --config small --schedule "$TP_SCHED" --final-only --seq 64
check "verify tp2 small ok" out "verify: ok"
run "verify tp2 x dp2" 0 $MPIRUN -np 4 "$SLAPO" verify --tp 2 --schedule "$TP_SCHED" --final-only
check "verify tp2 x dp2 layout" out "world 4 = tp 2 x dp 2"
check "verify tp2 x dp2 ok" out "verify: ok"

# Data parallelism equals gradient accumulation: 2 ranks, each half of the
# batch, against the reference training the halves as two micro-batches.
run "verify dp2" 0 $MPIRUN -np 2 "$SLAPO" verify --schedule "$ROOT/schedules/gpt2.sched" --final-only
check "verify dp2 layout" out "world 2 = tp 1 x dp 2"
check "verify dp2 ok" out "verify: ok"
# LLaMA: grouped-query attention split by key/value head.
run "verify llama tp2" 0 $MPIRUN -np 2 "$SLAPO" verify --model llama --tp 2 --schedule "$ROOT/schedules/llama_tp.sched" --final-only
check "verify llama tp2" out "verify: ok"
run "llama tp4 > kv heads" 1 $MPIRUN -np 4 "$SLAPO" verify --model llama --tp 4 --schedule "$ROOT/schedules/llama_tp.sched" --final-only
check "llama tp4 > kv heads" err "must divide n_kv_head = 2"
# BERT: heads split across query, key and value; sharded unlike, refused.
run "verify bert tp2" 0 $MPIRUN -np 2 "$SLAPO" verify --model bert --tp 2 --schedule "$ROOT/schedules/bert_tp.sched" --final-only
check "verify bert tp2" out "verify: ok"
printf 'bert.encoder.layer.0.attention.self.query shard weight axis=0\n' > "$TMP/bert_q_only.sched"
run "bert query alone" 1 $MPIRUN -np 2 "$SLAPO" verify --model bert --tp 2 --schedule "$TMP/bert_q_only.sched" --final-only
check "bert query alone" err "shard the three alike"
# GPT-2 `small` has 6 heads: 4 ranks would each get a head and a half.
run "gpt2 small tp4 > heads" 1 $MPIRUN -np 4 "$SLAPO" verify --tp 4 --config small --schedule "$TP_SCHED" --final-only --seq 64
check "gpt2 small tp4 > heads" err "keeps 288 of 1152 rows (4 ranks), not whole heads of 192 rows: the tensor-parallel size must divide n_head = 6"
run "verify dp2 odd batch" 1 $MPIRUN -np 2 "$SLAPO" verify --schedule "$TP_SCHED" --batch 3
check "verify dp2 odd batch" err "batch 3 does not split over 2 data-parallel ranks"

# Dropout under tensor parallelism (issue 32): every family's TP schedule
# and its variant without FlashAttention (the composite attention traced
# flat, its dropout a leaf emitted from the flattened graph), dropout 0.1:
# each rank draws its part of the unsharded model's masks from the values'
# layouts. Step by step on tiny, --final-only on small.
for fam in gpt2 llama bert; do
  for sched in ${fam}_tp ${fam}_tp_composite; do
    run "verify $sched dropout" 0 $MPIRUN -np 2 "$SLAPO" verify --model $fam --tp 2 \
      --schedule "$ROOT/schedules/$sched.sched" --dropout 0.1
    check "verify $sched dropout ok" out "verify: ok"
    run "verify $sched small dropout" 0 $MPIRUN -np 2 "$SLAPO" verify --model $fam --tp 2 \
      --config small --schedule "$ROOT/schedules/$sched.sched" --dropout 0.1 --final-only --seq 64
    check "verify $sched small dropout ok" out "verify: ok"
  done
done
# Four ranks: TP 2 x DP 2 (each data-parallel rank's dropout step), and TP
# 4 (one head a rank).
run "verify gpt2_tp_composite tp2 x dp2 dropout" 0 $MPIRUN -np 4 "$SLAPO" verify --tp 2 \
  --schedule "$ROOT/schedules/gpt2_tp_composite.sched" --dropout 0.1 --final-only
check "verify gpt2_tp_composite tp2 x dp2 dropout ok" out "verify: ok"
run "verify gpt2_tp_composite tp4 dropout" 0 $MPIRUN -np 4 "$SLAPO" verify --tp 4 \
  --schedule "$ROOT/schedules/gpt2_tp_composite.sched" --dropout 0.1 --final-only
check "verify gpt2_tp_composite tp4 dropout ok" out "verify: ok"
# Training with the composite attention at TP 2 equals one process, every
# family: the losses of 3 steps, dropout 0.1, to 1e-6 (GPT-2's drifted by
# 8e-4 when the flattened attention's dropout drew as if replicated).
DROP="train --config tiny --data $TEXT --steps 3 --batch 2 --seq 32 --sample 0 --dropout 0.1"
losses() { grep -o '"loss": [-0-9.e+]*' "$1" | cut -d' ' -f2; }
for fam in gpt2 llama bert; do
  run "train $fam dropout 1 process" 0 "$SLAPO" $DROP --model $fam --metrics "$TMP/$fam.1.jsonl"
  run "train $fam dropout tp2 composite" 0 $MPIRUN -np 2 "$SLAPO" $DROP --model $fam --tp 2 \
    --schedule "$ROOT/schedules/${fam}_tp_composite.sched" --metrics "$TMP/$fam.2.jsonl"
  if [ "$(losses "$TMP/$fam.1.jsonl" | wc -l)" -eq 3 ] &&
    paste <(losses "$TMP/$fam.1.jsonl") <(losses "$TMP/$fam.2.jsonl") |
    awk '{ d = $1 - $2; if (d < 0) d = -d; if (NF != 2 || d > 1e-6) bad = 1 } END { exit bad }'; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAIL train $fam dropout tp2 composite: losses $(losses "$TMP/$fam.2.jsonl" | tr '\n' ' ')" \
      "vs one process $(losses "$TMP/$fam.1.jsonl" | tr '\n' ' ')"
  fi
done

# Tensor parallelism changes no number beyond rounding: the same run on one
# process and on two ranks reaches the same validation loss (4 decimals).
COMMON="train --config tiny --data $TEXT --steps 12 --batch 2 --seq 32 --sample 0 --val-every 12 --dropout 0.1"
run "train 1 process" 0 "$SLAPO" $COMMON --save "$TMP/one.safetensors"
want=$(grep -o "val loss [0-9.]*" "$OUT" | tail -1)
run "train tp2" 0 $MPIRUN -np 2 "$SLAPO" $COMMON --tp 2 --schedule "$TP_SCHED" --save "$TMP/tp2.safetensors"
check "train tp2 layout" out "distributed: world 2 = tp 2 x dp 1"
check "train tp2 parameters per rank" out "parameters on each of 2 tensor-parallel ranks"
check "train tp2 same loss" out "$want"
# The gathered checkpoint holds unsharded tensors (it loads on one process)
# and resumes at another tensor-parallel size.
run "resume tp2 -> 1" 0 "$SLAPO" $COMMON --steps 14 --resume "$TMP/tp2.safetensors"
check "resume tp2 -> 1" out "resume: $TMP/tp2.safetensors at step 12"
run "resume 1 -> tp2" 0 $MPIRUN -np 2 "$SLAPO" $COMMON --steps 14 --tp 2 --schedule "$TP_SCHED" --resume "$TMP/one.safetensors"
check "resume 1 -> tp2" out "at step 12"
# TP 4 pads tiny's 256-row vocabulary to 512 (a multiple of 128 x 4): the
# padded classes stay out of the loss and the checkpoint is saved unpadded.
run "train tp4 (padded vocabulary)" 0 $MPIRUN -np 4 "$SLAPO" $COMMON --tp 4 --schedule "$TP_SCHED" --save "$TMP/tp4.safetensors"
check "train tp4 same loss" out "$want"
run "resume tp4 -> 1" 0 "$SLAPO" $COMMON --steps 14 --resume "$TMP/tp4.safetensors"
check "resume tp4 -> 1" out "at step 12"
# GPT-2 124M's vocabulary of 50257 padded to 50432 over two ranks.
RUN_TIMEOUT=900 run "verify 124M tp2" 0 $MPIRUN -np 2 "$SLAPO" verify --tp 2 --config 124M --schedule "$TP_SCHED" --final-only --batch 1 --seq 8
check "verify 124M tp2" out "verify: ok"
# Greedy sampling under TP (KV-cache decoding, gathered logits) writes the
# one-process text.
SAMPLE="train --config tiny --data $TEXT --steps 20 --batch 2 --seq 32 --sample 30 --top-k 1"
run "sample 1 process" 0 "$SLAPO" $SAMPLE
tail -2 "$OUT" >"$TMP/sample1"
run "sample tp2" 0 $MPIRUN -np 2 "$SLAPO" $SAMPLE --tp 2 --schedule "$TP_SCHED"
tail -2 "$OUT" >"$TMP/sample2"
if [ "$rc_ok" -eq 1 ] && cmp -s "$TMP/sample1" "$TMP/sample2"; then passed=$((passed + 1)); else
  failed=$((failed + 1)); echo "FAIL sample tp2: $(cat "$TMP/sample2") vs $(cat "$TMP/sample1")"; fi
run "train dp2" 0 $MPIRUN -np 2 "$SLAPO" $COMMON --batch 1 --metrics "$TMP/m.jsonl" --plot "$TMP/p.svg"
check "train dp2 layout" out "world 2 = tp 1 x dp 2"
check "train dp2 tokens a step" out "batch: 1 sequences of 32 tokens x 1 micro-batches x 2 data-parallel ranks = 64 tokens a step"
check "train dp2 plot (rank 0 writes)" out "plot: $TMP/p.svg"

# A world size the schedule cannot use: an error before any work.
run "tp does not divide" 1 $MPIRUN -np 3 "$SLAPO" verify --tp 2 --schedule "$TP_SCHED"
check "tp does not divide" err "--tp 2 does not divide the world size 3"
run "tp without mpirun" 1 "$SLAPO" verify --tp 2 --schedule "$TP_SCHED"
check "tp without mpirun" err "start it with mpirun -np 2"

# Rank 1 fails (its data file does not exist) while rank 0 goes on to its
# first collective: the job ends non-zero, well within 30 s.
start=$(date +%s)
run "failing rank" nonzero timeout 30 $MPIRUN -np 1 "$SLAPO" $COMMON --tp 2 --schedule "$TP_SCHED" \
  : -np 1 "$SLAPO" $COMMON --tp 2 --schedule "$TP_SCHED" --data "$TMP/missing.txt"
check "failing rank message" err "slapo: rank 1: io:"
elapsed=$(($(date +%s) - start))
if [ "$elapsed" -le 30 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL failing rank: took ${elapsed}s"; fi

summary
