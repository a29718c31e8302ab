#!/usr/bin/env bash
# tests/cli/test_cli_dist.sh - `slapo` under mpirun: tensor-parallel verify
# of schedules/gpt2_tp.sched (2 ranks; 4 ranks as TP 2 x DP 2), training with
# TP 2 matching one process exactly, a gathered checkpoint resumed at
# another TP size, a world size the schedule or the model cannot use (6
# heads over 4 ranks), a failing rank ending the whole job within 30 s
# with its "slapo: rank R:" message, ranks started with different
# arguments refused before they communicate, dropout under tensor
# parallelism (every family's TP schedule and its composite-attention
# variant, dropout 0.1, and a training run equal to one process's to 1e-6),
# and a stopped rank ending the job after --comm-timeout with "no progress
# in ...".
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
# same_losses NAME ONE OTHER N : the metrics files ONE and OTHER hold N
# losses each, equal to 1e-6 (a check passed or failed).
same_losses() {
  if paste <(losses "$2") <(losses "$3") |
    awk -v n="$4" '{ d = $1 - $2; if (d < 0) d = -d; if (NF != 2 || d > 1e-6) bad = 1 } END { exit bad || NR != n }'; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAIL $1: losses $(losses "$3" | tr '\n' ' ') vs one process $(losses "$2" | tr '\n' ' ')"
  fi
}
for fam in gpt2 llama bert; do
  run "train $fam dropout 1 process" 0 "$SLAPO" $DROP --model $fam --metrics "$TMP/$fam.1.jsonl"
  run "train $fam dropout tp2 composite" 0 $MPIRUN -np 2 "$SLAPO" $DROP --model $fam --tp 2 \
    --schedule "$ROOT/schedules/${fam}_tp_composite.sched" --metrics "$TMP/$fam.2.jsonl"
  same_losses "train $fam dropout tp2 composite" "$TMP/$fam.1.jsonl" "$TMP/$fam.2.jsonl" 3
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
# A full disk at the next save (each rank limited by ulimit -f so the
# weights file fits and the optimizer file does not: EFBIG, SIGXFSZ
# ignored): rank 0, the writer, fails naming the file and the cause, every
# rank returns its message and the job ends,
# and the step-12 pair is left byte for byte (the resume below reads it).
sum_before=$(cat "$TMP/tp2.safetensors" "$TMP/tp2.optim.safetensors" | cksum)
kib=$(( ($(stat -c %s "$TMP/tp2.safetensors") + 8192) / 1024 ))
run "tp2 save on a full disk" nonzero timeout 60 $MPIRUN -np 2 bash -c "trap '' XFSZ; ulimit -f $kib; \
  exec $SLAPO $COMMON --steps 14 --tp 2 --schedule $TP_SCHED --resume $TMP/tp2.safetensors \
  --save $TMP/tp2.safetensors"
# Every rank gets rank 0's message; whichever aborts first prints it.
check_re "tp2 save on a full disk" err "slapo: rank [01]: io: train: saving checkpoint $TMP/tp2.safetensors at step 14 failed writing its optimizer state"
check "tp2 save on a full disk: cause" err "File too large [EFBIG"
check "tp2 save on a full disk: kept" err "the previous checkpoint (step 12) is kept as it was"
if [ "$(cat "$TMP/tp2.safetensors" "$TMP/tp2.optim.safetensors" | cksum)" = "$sum_before" ] &&
  [ ! -e "$TMP/tp2.new.safetensors" ] && [ ! -e "$TMP/tp2.new.optim.safetensors" ]; then
  passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL tp2 save on a full disk: the pair changed"; fi
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

# Pipeline parallelism (issue 38): tiny cut after its second block into two
# stages, one a rank (four stages further down). verify --pp: the pipelined step against one process
# over the same 4 micro-batches, dropout 0.1: loss and untied gradients
# bitwise, the tied embedding within 1e-6; 1F1B and GPipe, the default
# schedule's FlashAttention and cc fusions with the cut, and `small`.
PP_SCHED="$TMP/gpt2_pp.sched"
{ cat "$ROOT/schedules/gpt2.sched"; echo "transformer.h.1 cut"; } >"$PP_SCHED"
printf 'transformer.h.1 cut\n' >"$TMP/cut.sched"
run "verify pp2" 0 $MPIRUN -np 2 "$SLAPO" verify --pp 2 --schedule "$TMP/cut.sched" --atol 1e-6
check "verify pp2 layout" out "distributed: world 2 = pp 2 x dp 1 x tp 1"
check_re "verify pp2 bitwise" out "loss equal bitwise .*; 51 gradients equal bitwise, 1 tied within 1e-06"
check "verify pp2 ok" out "verify: ok"
run "verify pp2 gpipe" 0 $MPIRUN -np 2 "$SLAPO" verify --pp 2 --pp-schedule gpipe --schedule "$PP_SCHED" --atol 1e-6
check "verify pp2 gpipe" out "2 stages (GPipe, 4 micro-batches)"
check "verify pp2 gpipe ok" out "verify: ok"
run "verify pp2 small" 0 $MPIRUN -np 2 "$SLAPO" verify --pp 2 --config small --seq 64 --grad-accum 3 --schedule "$PP_SCHED" --atol 1e-6
check "verify pp2 small ok" out "verify: ok"
# --pp without cut lines: the stages balanced by cost, their cut lines
# printed; every family.
run "verify pp2 balanced" 0 $MPIRUN -np 2 "$SLAPO" verify --pp 2 --schedule "$ROOT/schedules/gpt2.sched" --atol 1e-6
check "verify pp2 balanced: lines" out "2 stages balanced by cost"
check "verify pp2 balanced: cut" out "transformer.h.1 cut"
check "verify pp2 balanced ok" out "verify: ok"
run "verify pp2 llama" 0 $MPIRUN -np 2 "$SLAPO" verify --pp 2 --model llama --schedule "$ROOT/schedules/llama.sched"
check "verify pp2 llama cut" out "model.layers.1 cut"
check "verify pp2 llama ok" out "verify: ok"
run "verify pp2 bert" 0 $MPIRUN -np 2 "$SLAPO" verify --pp 2 --model bert --atol 1e-6
check "verify pp2 bert cut" out "bert.encoder.layer.1 cut"
check "verify pp2 bert ok" out "verify: ok"
run "pp5 > blocks" 1 $MPIRUN -np 5 "$SLAPO" verify --pp 5
check "pp5 > blocks" err "--pp 5: transformer.h has 4 blocks to split into stages"
# Training: 5 steps of 4 micro-batches print one process's losses (the tied
# embedding's gradient sums in another order: 1e-6), and a checkpoint
# saved by the stages resumes to the same step 4 as an unbroken run.
PP="train --config tiny --data $TEXT --batch 2 --seq 32 --sample 0 --grad-accum 4 --val-every 2"
run "train pp 1 process" 0 "$SLAPO" $PP --steps 5 --schedule "$PP_SCHED" --metrics "$TMP/pp.1.jsonl"
run "train pp2" 0 $MPIRUN -np 2 "$SLAPO" $PP --steps 5 --pp 2 --schedule "$PP_SCHED" --metrics "$TMP/pp.2.jsonl"
check "train pp2 stages" out "pipeline: 2 stages, 1F1B over 4 micro-batches"
check_re "train pp2 memory a stage" out "memory: stage 0: [0-9.]+M parameters x 16 bytes .* \(2 slots\)"
# A stage that does not fit is refused before it allocates, with its figures.
run "pp2 memory limit" nonzero timeout 60 $MPIRUN -np 2 -x SLAPO_MEMORY_LIMIT=1M "$SLAPO" $PP --steps 1 --pp 2
check_re "pp2 memory limit" err "slapo: rank [01]: limit: train: --pp 2: stage [01]: .* but 1.0 MiB are available \(SLAPO_MEMORY_LIMIT\)"
same_losses "train pp2" "$TMP/pp.1.jsonl" "$TMP/pp.2.jsonl" 5
# Four stages, one block each, balanced without cut lines (the tied
# embedding summed across the two middle stages too).
run "train pp 1 process, 6 micro-batches" 0 "$SLAPO" $PP --steps 3 --grad-accum 6 --metrics "$TMP/pp4.1.jsonl"
run "train pp4" 0 $MPIRUN -np 4 "$SLAPO" $PP --steps 3 --grad-accum 6 --pp 4 --metrics "$TMP/pp4.4.jsonl"
check "train pp4 cuts" out "transformer.h.2 cut"
same_losses "train pp4" "$TMP/pp4.1.jsonl" "$TMP/pp4.4.jsonl" 3
# Pipeline x data parallelism: 2 stages x 2 data-parallel ranks of 4
# micro-batches each are one process's 8 micro-batches.
run "train pp 1 process, 8 micro-batches" 0 "$SLAPO" $PP --steps 3 --grad-accum 8 --metrics "$TMP/ppdp.1.jsonl"
run "train pp2 x dp2" 0 $MPIRUN -np 4 "$SLAPO" $PP --steps 3 --grad-accum 4 --pp 2 --metrics "$TMP/ppdp.4.jsonl"
check "train pp2 x dp2 layout" out "world 4 = pp 2 x dp 2 x tp 1"
same_losses "train pp2 x dp2" "$TMP/ppdp.1.jsonl" "$TMP/ppdp.4.jsonl" 3
run "pp with tp" 2 "$SLAPO" train --pp 2 --tp 2
check "pp with tp" err "--tp and --pp together (tensor-parallel stages) are not built yet"
run "train pp2 to step 4" 0 $MPIRUN -np 2 "$SLAPO" $PP --steps 4 --pp 2 --schedule "$PP_SCHED" --save "$TMP/pp.safetensors"
want=$(grep -o "step 4/4 loss [0-9.]*" "$OUT")
run "train pp2 save at 2" 0 $MPIRUN -np 2 "$SLAPO" $PP --steps 2 --pp 2 --schedule "$PP_SCHED" --save "$TMP/pp2.safetensors"
run "train pp2 resume" 0 $MPIRUN -np 2 "$SLAPO" $PP --steps 4 --pp 2 --schedule "$PP_SCHED" --resume "$TMP/pp2.safetensors"
check "train pp2 resume: same step 4" out "$want"
# The stages' checkpoint is the whole model: it resumes on one process.
run "resume pp2 -> 1" 0 "$SLAPO" $PP --steps 4 --schedule "$PP_SCHED" --resume "$TMP/pp2.safetensors"
check "resume pp2 -> 1" out "resume: $TMP/pp2.safetensors at step 2"
# LLaMA (no tied weights) and BERT (masked LM, tied decoder) train as one
# process does, validation through the stages included.
for fam in llama bert; do
  FP="train --model $fam --config tiny --data $TEXT --steps 3 --batch 2 --seq 32 --grad-accum 2 --sample 0 --val-every 3"
  run "train $fam pp 1 process" 0 "$SLAPO" $FP --metrics "$TMP/$fam.pp1.jsonl"
  run "train $fam pp2" 0 $MPIRUN -np 2 "$SLAPO" $FP --pp 2 --metrics "$TMP/$fam.pp2.jsonl"
  same_losses "train $fam pp2" "$TMP/$fam.pp1.jsonl" "$TMP/$fam.pp2.jsonl" 3
  check "train $fam pp2 validation" out "val_loss"
done
# Each rank loads its stage's part of a file: --init-from a one-process
# checkpoint trains as one process does from it.
run "train pp init-from 1 process" 0 "$SLAPO" $PP --steps 2 --init-from "$TMP/pp2.safetensors" --metrics "$TMP/ppi.1.jsonl"
run "train pp2 init-from" 0 $MPIRUN -np 2 "$SLAPO" $PP --steps 2 --pp 2 --init-from "$TMP/pp2.safetensors" --metrics "$TMP/ppi.2.jsonl"
same_losses "train pp2 init-from" "$TMP/ppi.1.jsonl" "$TMP/ppi.2.jsonl" 2
# Stage 0 samples from the whole model, gathered: greedy sampling writes
# the one-process text.
PSAMPLE="train --config tiny --data $TEXT --steps 20 --batch 2 --seq 32 --sample 30 --top-k 1 --grad-accum 2"
run "sample pp 1 process" 0 "$SLAPO" $PSAMPLE
tail -2 "$OUT" >"$TMP/psample1"
run "sample pp2" 0 $MPIRUN -np 2 "$SLAPO" $PSAMPLE --pp 2
tail -2 "$OUT" >"$TMP/psample2"
if [ "$rc_ok" -eq 1 ] && [ -s "$TMP/psample1" ] && cmp -s "$TMP/psample1" "$TMP/psample2"; then
  passed=$((passed + 1)); else failed=$((failed + 1))
  echo "FAIL sample pp2: $(cat "$TMP/psample2") vs $(cat "$TMP/psample1")"; fi
# Pipeline errors: a world --pp does not divide, stage counts that differ.
run "pp does not divide" 1 $MPIRUN -np 3 "$SLAPO" verify --pp 2 --schedule "$TMP/cut.sched"
check "pp does not divide" err "--pp 2 x --tp 1 = 2 does not divide the world size 3"
run "pp without mpirun" 1 "$SLAPO" train --pp 2 --schedule "$TMP/cut.sched" --steps 1
check "pp without mpirun" err "--tp 1 x --pp 2 needs 2 processes; this is one process (start it with mpirun -np 2)"
run "pp3 with one cut" 1 $MPIRUN -np 3 "$SLAPO" $PP --steps 1 --pp 3 --schedule "$TMP/cut.sched"
check "pp3 with one cut" err "train: --pp 3 needs 3 stages, but the schedule"
run "verify pp with dp" 1 $MPIRUN -np 4 "$SLAPO" verify --pp 2 --schedule "$TMP/cut.sched"
check "verify pp with dp" err "verify --pp 2: run it on 2 ranks, one a stage (the world is 4"

# A world size the schedule cannot use: an error before any work.
run "tp does not divide" 1 $MPIRUN -np 3 "$SLAPO" verify --tp 2 --schedule "$TP_SCHED"
check "tp does not divide" err "--tp 2 does not divide the world size 3"
run "tp without mpirun" 1 "$SLAPO" verify --tp 2 --schedule "$TP_SCHED"
check "tp without mpirun" err "start it with mpirun -np 2"

# Rank 1 fails (its memory limit, which may differ between ranks, is too
# small for the model) while rank 0 goes on to its first collective: the
# job ends non-zero, well within 30 s. (A data file missing on one rank
# alone is a difference in --data, refused before, below.)
start=$(date +%s)
run "failing rank" nonzero timeout 30 $MPIRUN -np 1 "$SLAPO" $COMMON --tp 2 --schedule "$TP_SCHED" \
  : -np 1 env SLAPO_MEMORY_LIMIT=1K "$SLAPO" $COMMON --tp 2 --schedule "$TP_SCHED"
check "failing rank message" err "slapo: rank 1: limit: train: gpt2 tiny"
elapsed=$(($(date +%s) - start))
if [ "$elapsed" -le 30 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL failing rank: took ${elapsed}s"; fi

# A rank that stops answering (SIGSTOP: to its peers it looks like a lost
# link) ends the job: rank 0, waiting on it in a collective, reports "no
# progress in ..." once --comm-timeout (8 s) passes and aborts the job.
# Past its first second of waiting rank 0 sleeps (under 50 % of a core),
# unlike MPI's blocking calls. stall NAME ARGS... : trains under mpirun -np 2 with ARGS, stops rank
# 1 after step 10.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
stall() {
  local name=$1
  shift
  rm -f "$TMP"/pid.*
  timeout 60 $MPIRUN -np 2 --bind-to none sh -c 'echo $$ >"$0.$OMPI_COMM_WORLD_RANK"; exec "$@"' \
    "$TMP/pid" "$SLAPO" $COMMON --steps 100000 --comm-timeout 8 "$@" >"$OUT" 2>"$ERR" &
  local job=$! i
  for i in $(seq 300); do
    grep -q "^step 10/" "$OUT" && [ -s "$TMP/pid.0" ] && [ -s "$TMP/pid.1" ] && break
    sleep 0.2
  done
  local p0 p1 t0 c0 c1 rc took
  p0=$(cat "$TMP/pid.0" 2>/dev/null) p1=$(cat "$TMP/pid.1" 2>/dev/null)
  kill -STOP "$p1"
  t0=$(date +%s)
  sleep 3
  c0=$(cpu_ticks "$p0")
  sleep 2
  c1=$(cpu_ticks "$p0")
  wait $job
  rc=$?
  took=$(($(date +%s) - t0))
  kill -KILL "$p1" 2>/dev/null
  rc_ok=1
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$took" -lt 7 ] || [ "$took" -gt 35 ]; then
    rc_ok=0
    failed=$((failed + 1))
    echo "FAIL $name: exit $rc after ${took}s (want non-zero within 7-35 s)"
    echo "  stderr: $(head -c 600 "$ERR")"
  fi
  check "$name message" err "slapo: rank 0: comm: no progress in "
  check "$name peers" err "for 8 s (peer ranks 1)"
  # 2 s of waiting at 100 ticks/s: a spinning rank uses ~200 ticks.
  if [ "$rc_ok" -eq 1 ] && [ $((c1 - c0)) -ge 100 ]; then
    failed=$((failed + 1))
    echo "FAIL $name: rank 0 used $((c1 - c0)) ticks of CPU in 2 s of waiting"
  elif [ "$rc_ok" -eq 1 ]; then passed=$((passed + 1)); fi
}
stall "stalled rank (dp2)" --batch 1
stall "stalled rank (tp2)" --tp 2 --schedule "$TP_SCHED"
# A stopped pipeline stage: its neighbour waits in a point-to-point exchange.
stall "stalled rank (pp2)" --pp 2 --grad-accum 2
run "comm timeout bad value" 2 "$SLAPO" $COMMON --comm-timeout 0
check "comm timeout bad value" err "--comm-timeout: bad value '0'; expected seconds > 0"
SLAPO_COMM_TIMEOUT=soon run "SLAPO_COMM_TIMEOUT bad value" 1 "$SLAPO" $COMMON
check "SLAPO_COMM_TIMEOUT bad value" err "SLAPO_COMM_TIMEOUT='soon': expected seconds > 0"

# Ranks started with different arguments (MPMD launches, wrapper scripts):
# before any collective sized by the arguments, every rank ends with
# "slapo: rank R:" naming the option, rank 0's value and rank 1's, exit 1,
# within 30 s; never heap corruption, a signal or a hang. A full command
# line per rank: A is rank 0's, B rank 1's extra options.
AGREE="train --config tiny --data $TEXT --steps 2 --batch 2 --seq 32 --sample 0 --val-every 2"
sed 's/fox/cat/' "$TEXT" >"$TMP/corpus2.txt" # the same size, another content
mkdir -p "$TMP/sa" "$TMP/sb"
cp "$ROOT/schedules/gpt2_tp.sched" "$TMP/sa/gpt2.sched"
cp "$ROOT/schedules/gpt2_tp.sched" "$TMP/sb/gpt2.sched"
echo "transformer.h.0.mlp.c_fc shard weight axis=0" >>"$TMP/sb/gpt2.sched" # one more line
mismatch() { # NAME WANT A_OPTIONS B_OPTIONS
  local name=$1 want=$2 start elapsed
  start=$(date +%s)
  run "ranks differ: $name" 1 timeout 30 $MPIRUN -np 1 "$SLAPO" $AGREE $3 : -np 1 "$SLAPO" $AGREE $4
  elapsed=$(($(date +%s) - start))
  check "ranks differ: $name: rank 0 says" err "slapo: rank 0: invalid_arg: the ranks were started with different arguments: $want"
  check "ranks differ: $name: rank 1 says" err "slapo: rank 1: invalid_arg: the ranks were started with different arguments: $want"
  lacks "ranks differ: $name: no crash" err "corrupt|free\(\)|[Ss]ignal|Segmentation"
  if [ "$elapsed" -le 30 ]; then passed=$((passed + 1)); else
    failed=$((failed + 1)); echo "FAIL ranks differ: $name: took ${elapsed}s"; fi
}
mismatch "--schedule" "--schedule: rank 0 has $TP_SCHED, rank 1 has $ROOT/schedules/gpt2.sched" \
  "--tp 2 --schedule $TP_SCHED" "--tp 2 --schedule $ROOT/schedules/gpt2.sched"
mismatch "--config" "--config: rank 0 has tiny, rank 1 has small" \
  "--tp 2 --schedule $TP_SCHED" "--tp 2 --schedule $TP_SCHED --config small"
mismatch "--seq" "--seq: rank 0 has 32, rank 1 has 16" \
  "--tp 2 --schedule $TP_SCHED" "--tp 2 --schedule $TP_SCHED --seq 16"
mismatch "--pp" "--pp: rank 0 has 2, rank 1 has 1" "--pp 2" ""
mismatch "--pp-schedule" "--pp-schedule: rank 0 has 1f1b, rank 1 has gpipe" "--pp 2" \
  "--pp 2 --pp-schedule gpipe"
mismatch "--tp" "--tp: rank 0 has 1, rank 1 has 2" \
  "--tp 1 --schedule $TP_SCHED" "--tp 2 --schedule $TP_SCHED"
mismatch "--tp not dividing" "--tp: rank 0 has 3, rank 1 has 1" "--tp 3" "--tp 1"
mismatch "--data path" "--data: rank 0 has $TEXT (4980 bytes), rank 1 has $TMP/corpus2.txt (4980 bytes)" \
  "--tp 2 --schedule $TP_SCHED" "--tp 2 --schedule $TP_SCHED --data $TMP/corpus2.txt"
# The data's content, not its name: one relative path, two directories.
mkdir -p "$TMP/da" "$TMP/db"
cp "$TEXT" "$TMP/da/corpus.txt"
cp "$TMP/corpus2.txt" "$TMP/db/corpus.txt"
run "ranks differ: data content" 1 timeout 30 $MPIRUN -np 1 -wdir "$TMP/da" "$SLAPO" $AGREE --data corpus.txt \
  : -np 1 -wdir "$TMP/db" "$SLAPO" $AGREE --data corpus.txt
check_re "ranks differ: data content" err "slapo: rank 1: invalid_arg: .* --data: rank 0 has corpus.txt \(4980 bytes\) \(digest [0-9a-f]{16}\), rank 1 has corpus.txt \(4980 bytes\) \(digest [0-9a-f]{16}\)"
mismatch "--seed" "--seed: rank 0 has 1337, rank 1 has 7" \
  "--tp 2 --schedule $TP_SCHED" "--tp 2 --schedule $TP_SCHED --seed 7"
mismatch "--model" "--model: rank 0 has gpt2, rank 1 has llama" "--tp 2" "--tp 2 --model llama"
mismatch "--save-every" "--save-every: rank 0 has 0, rank 1 has 1" \
  "--tp 2 --schedule $TP_SCHED --save $TMP/ag.safetensors" \
  "--tp 2 --schedule $TP_SCHED --save $TMP/ag.safetensors --save-every 1"
mismatch "--dropout" "--dropout: rank 0 has -1, rank 1 has 0.1" "" "--dropout 0.1"
mismatch "--data missing on one rank" "--data: rank 0 has $TEXT (4980 bytes), rank 1 has $TMP/missing.txt (unreadable)" \
  "" "--data $TMP/missing.txt"
# The schedule's content, not its name: `default` resolved in two
# directories holding different gpt2.sched files.
start=$(date +%s)
run "ranks differ: schedule content" 1 timeout 30 $MPIRUN -np 1 env SLAPO_SCHEDULE_DIR="$TMP/sa" "$SLAPO" $AGREE --tp 2 --schedule default \
  : -np 1 env SLAPO_SCHEDULE_DIR="$TMP/sb" "$SLAPO" $AGREE --tp 2 --schedule default
check "ranks differ: schedule content" err "--schedule: rank 0 has $TMP/sa/gpt2.sched, rank 1 has $TMP/sb/gpt2.sched"
# Another command on one rank.
run "ranks differ: command" 1 timeout 30 $MPIRUN -np 1 "$SLAPO" verify --tp 2 --schedule "$TP_SCHED" --final-only \
  : -np 1 "$SLAPO" $AGREE --tp 2 --schedule "$TP_SCHED"
check "ranks differ: command" err "command: rank 0 has verify, rank 1 has train"
run "ranks differ: verify --seed" 1 timeout 30 $MPIRUN -np 1 "$SLAPO" verify --tp 2 --schedule "$TP_SCHED" --final-only \
  : -np 1 "$SLAPO" verify --tp 2 --schedule "$TP_SCHED" --final-only --seed 3
check "ranks differ: verify --seed" err "slapo: rank 1: invalid_arg: the ranks were started with different arguments: --seed: rank 0 has 1337, rank 1 has 3"
# What may differ: threads and the rank-0-only outputs.
run "ranks may differ: --threads, --metrics" 0 timeout 60 $MPIRUN -np 1 "$SLAPO" $AGREE --tp 2 --schedule "$TP_SCHED" --threads 1 --metrics "$TMP/ag.jsonl" \
  : -np 1 "$SLAPO" $AGREE --tp 2 --schedule "$TP_SCHED" --threads 2
check "ranks may differ: rank 0 writes the metrics" "$TMP/ag.jsonl" '"step": 2'
# --tp 2 with nothing sharded: correct, but the same work twice; said once.
run "tp2 shards nothing" 0 $MPIRUN -np 2 "$SLAPO" $AGREE --tp 2
check "tp2 shards nothing: warned" out "warning: --tp 2 but no parameter is sharded (schedule: none)"
run "tp2 shards: no warning" 0 $MPIRUN -np 2 "$SLAPO" $AGREE --tp 2 --schedule "$TP_SCHED"
lacks "tp2 shards: no warning" out "no parameter is sharded"

summary
