#!/usr/bin/env bash
# bench/run_dist_bench.sh BUILD - distributed GPT-2 training steps side by
# side, in rounds (interleaved, so drift hits every row alike), medians:
#   1 process, 2 OpenMP threads, schedules/gpt2.sched (the baseline)
#   TP 2 (mpirun -np 2, 1 thread each), schedules/gpt2_tp.sched
#   DP 2 (mpirun -np 2, 1 thread each, half the batch each), gpt2.sched
#   TP 2 x DP 2 (mpirun -np 4 on this machine's cores, oversubscribed where
#   there are fewer than 4), gpt2_tp.sched
# at the same global batch (CONFIG, B4 T256 by default). Prints each row's
# bench_dist line per round, then the medians and the ratio to the baseline.
# Env: CONFIG (small), BATCH (4), SEQ (256), STEPS (6), ROUNDS (3).
set -euo pipefail
BUILD=${1:?usage: run_dist_bench.sh BUILD}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CONFIG=${CONFIG:-small} BATCH=${BATCH:-4} SEQ=${SEQ:-256} STEPS=${STEPS:-6} ROUNDS=${ROUNDS:-3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
B=$BUILD/bench_bench_dist
MPI="mpirun --oversubscribe --bind-to none"
common="--config $CONFIG --seq $SEQ --steps $STEPS"
"$BUILD/bench_bench_train" --machine
declare -A rows=(
  [1proc]="env OMP_NUM_THREADS=2 $B $common --batch $BATCH --schedule $ROOT/schedules/gpt2.sched"
  [tp2]="env OMP_NUM_THREADS=1 $MPI -np 2 $B $common --batch $BATCH --tp 2 --schedule $ROOT/schedules/gpt2_tp.sched"
  [dp2]="env OMP_NUM_THREADS=1 $MPI -np 2 $B $common --batch $((BATCH / 2)) --schedule $ROOT/schedules/gpt2.sched"
  [tp2xdp2]="env OMP_NUM_THREADS=1 $MPI -np 4 $B $common --batch $((BATCH / 2)) --tp 2 --schedule $ROOT/schedules/gpt2_tp.sched"
)
order="1proc tp2 dp2 tp2xdp2"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for r in $(seq "$ROUNDS"); do
  for k in $order; do
    line=$(${rows[$k]} | grep '^bench_dist:')
    echo "round $r $k: $line"
    echo "$k $line" >>"$out"
  done
done
echo "medians of $ROUNDS rounds (tokens/s, step ms, communication ms, peak RSS a rank):"
python3 - "$out" $order <<'PY'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    k, rest = line.split(" ", 1)
    m = re.search(r"([\d.]+) tok/s, step ([\d.]+) ms = compute ([\d.]+) \+ tp collectives ([\d.]+) \+ dp all-reduce ([\d.]+) ms.*planned activations (\d+) MiB, peak RSS (\d+) MiB", rest)
    rows.setdefault(k, []).append([float(x) for x in m.groups()])
base = statistics.median(r[0] for r in rows["1proc"])
for k in sys.argv[2:]:
    med = [statistics.median(r[i] for r in rows[k]) for i in range(7)]
    print(f"  {k:8s} {med[0]:8.1f} tok/s ({med[0] / base:.2f}x)  step {med[1]:6.1f} ms  "
          f"comm {med[3] + med[4]:5.1f} ms ({100 * (med[3] + med[4]) / med[1]:.0f}%)  "
          f"activations {med[5]:.0f} MiB  RSS {med[6]:.0f} MiB")
PY
