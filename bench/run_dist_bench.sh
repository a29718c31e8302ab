#!/usr/bin/env bash
# bench/run_dist_bench.sh BUILD [ROWS...] - distributed GPT-2 training steps
# side by side, in rounds (interleaved, so drift hits every row alike),
# medians. Rows (all by default, in this order):
#   1proc    1 process, 2 OpenMP threads, schedules/gpt2.sched, batch B
#   1proc1t  1 process, 1 thread, gpt2.sched, batch B (the base of dp2b)
#   tp2      TP 2 (mpirun -np 2, 1 thread each), schedules/gpt2_tp.sched
#   dp2      DP 2 (mpirun -np 2, 1 thread each, B/2 each: the same global
#            batch, strong scaling), gpt2.sched
#   dp2b     DP 2 (1 thread each, B each: the same batch a rank as 1proc1t,
#            weak scaling)
#   tp2xdp2  TP 2 x DP 2 (mpirun -np 4, oversubscribed where there are fewer
#            than 4 cores), gpt2_tp.sched
# and, with M = GRAD_ACCUM (8) micro-batches a step, gpt2.sched:
#   1procM   1 process, 2 threads        1procM1t  1 process, 1 thread
#   pp2      2 pipeline stages balanced by cost (1 thread each), 1F1B
#   pp2gpipe the same in GPipe order
# CONFIG (small), B = BATCH (4), SEQ (256). Prints each row's bench_dist
# lines per round, then the medians: tokens/s and their ratio to 1proc and
# to 1proc1t, step and communication ms, and for the DP rows the gradient
# all-reduce alone against a memcpy of the same bytes.
# Env: CONFIG, BATCH, SEQ, STEPS (6), ROUNDS (3), BUILD_BEFORE (a second
# build whose rows run interleaved with BUILD's, named "<row>@before").
set -euo pipefail
BUILD=${1:?usage: run_dist_bench.sh BUILD [ROWS...]}
shift
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CONFIG=${CONFIG:-small} BATCH=${BATCH:-4} SEQ=${SEQ:-256} STEPS=${STEPS:-6} ROUNDS=${ROUNDS:-3}
M=${GRAD_ACCUM:-8}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPI="timeout 900 mpirun --oversubscribe --bind-to none"
common="--config $CONFIG --seq $SEQ --steps $STEPS"
"$BUILD/bench_bench_train" --machine
row() { # row NAME BUILD_DIR: the command line
  local B=$2/bench_bench_dist
  case $1 in
  1proc) echo "env OMP_NUM_THREADS=2 timeout 900 $B $common --batch $BATCH --schedule $ROOT/schedules/gpt2.sched" ;;
  1proc1t) echo "env OMP_NUM_THREADS=1 timeout 900 $B $common --batch $BATCH --schedule $ROOT/schedules/gpt2.sched" ;;
  tp2) echo "env OMP_NUM_THREADS=1 $MPI -np 2 $B $common --batch $BATCH --tp 2 --schedule $ROOT/schedules/gpt2_tp.sched" ;;
  dp2) echo "env OMP_NUM_THREADS=1 $MPI -np 2 $B $common --batch $((BATCH / 2)) --schedule $ROOT/schedules/gpt2.sched" ;;
  dp2b) echo "env OMP_NUM_THREADS=1 $MPI -np 2 $B $common --batch $BATCH --schedule $ROOT/schedules/gpt2.sched" ;;
  tp2xdp2) echo "env OMP_NUM_THREADS=1 $MPI -np 4 $B $common --batch $((BATCH / 2)) --tp 2 --schedule $ROOT/schedules/gpt2_tp.sched" ;;
  1procM) echo "env OMP_NUM_THREADS=2 timeout 900 $B $common --batch $BATCH --grad-accum $M --schedule $ROOT/schedules/gpt2.sched" ;;
  1procM1t) echo "env OMP_NUM_THREADS=1 timeout 900 $B $common --batch $BATCH --grad-accum $M --schedule $ROOT/schedules/gpt2.sched" ;;
  pp2) echo "env OMP_NUM_THREADS=1 $MPI -np 2 $B $common --batch $BATCH --grad-accum $M --pp 2 --schedule $ROOT/schedules/gpt2.sched" ;;
  pp2gpipe) echo "env OMP_NUM_THREADS=1 $MPI -np 2 $B $common --batch $BATCH --grad-accum $M --pp 2 --gpipe --schedule $ROOT/schedules/gpt2.sched" ;;
  *) echo "run_dist_bench.sh: unknown row $1" >&2; exit 2 ;;
  esac
}
order=${*:-1proc 1proc1t tp2 dp2 dp2b tp2xdp2}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for r in $(seq "$ROUNDS"); do
  for k in $order; do
    for which in now ${BUILD_BEFORE:+before}; do
      dir=$BUILD name=$k
      [ "$which" = before ] && dir=$BUILD_BEFORE name=$k@before
      lines=$($(row "$k" "$dir") | grep '^bench_dist:')
      echo "round $r $name (load $(cut -d' ' -f1 /proc/loadavg)): $lines"
      echo "$lines" | sed "s|^|$name |" >>"$out"
    done
  done
done
echo "medians of $ROUNDS rounds (tokens/s, step ms, communication ms, peak RSS a rank; all-reduce alone vs memcpy):"
python3 - "$out" <<'PY'
import re, statistics, sys
rows, ar = {}, {}
for line in open(sys.argv[1]):
    k, rest = line.split(" ", 1)
    m = re.search(r"([\d.]+) tok/s, step ([\d.]+) ms = compute ([-\d.]+) \+ tp collectives ([\d.]+) \+ dp all-reduce ([\d.]+) ms.*planned activations (\d+) MiB, peak RSS (\d+) MiB a rank \((\d+) MiB after", rest)
    if m:
        rows.setdefault(k, []).append([float(x) for x in m.groups()])
    m = re.search(r"all-reduce alone ([\d.]+) ms for ([\d.]+) MB = ([\d.]+)x a memcpy of the same bytes \(([\d.]+) ms\)", rest)
    if m:
        ar.setdefault(k, []).append([float(x) for x in m.groups()])
med = lambda v, i: statistics.median(r[i] for r in v)
def base(name, k):
    b = name + ("@before" if k.endswith("@before") else "")
    return med(rows[b], 0) if b in rows else None
for k, v in rows.items():
    # rows with micro-batches compare with one process running as many
    names = ("1procM", "1procM1t") if k.startswith(("1procM", "pp")) else ("1proc", "1proc1t")
    ratios = "".join(f" ({med(v, 0) / b:.2f}x {n})" for n in names if (b := base(n, k)))
    comm = med(v, 3) + med(v, 4)
    print(f"  {k:16s} {med(v, 0):8.1f} tok/s{ratios}  step {med(v, 1):7.1f} ms  comm {comm:6.1f} ms "
          f"({100 * comm / med(v, 1):.0f}%)  activations {med(v, 5):.0f} MiB  RSS {med(v, 6):.0f} MiB "
          f"peak, {med(v, 7):.0f} MiB after")
    if k in ar:
        a = ar[k]
        print(f"  {'':16s} gradient all-reduce alone {med(a, 0):.1f} ms for {med(a, 1):.1f} MB = "
              f"{med(a, 2):.2f}x a memcpy ({med(a, 3):.2f} ms)")
PY
