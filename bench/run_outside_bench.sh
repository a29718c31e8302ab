#!/usr/bin/env bash
# bench/run_outside_bench.sh - the time a training step spends outside the
# GEMM nodes and AdamW, for several builds side by side (e.g. a baseline
# commit's build and the current one), interleaved round by round so all
# see the same machine load; medians over the rounds.
#
#   bench/run_outside_bench.sh BUILD_DIR...          (each with bench_bench_train)
#   ROUNDS=3 STEPS=6 CONFIG=124M B=4 T=64 SCHEDULE=schedules/gpt2.sched \
#     bench/run_outside_bench.sh /tmp/base/build build
#
# From `bench_train --profile`: outside = graph ms (all nodes, mean per step)
# - the matmul and linear rows + the clip-norm phase (median). Builds before
# the gradients were written straight into the grads (SLAPO_ACC_WRITE) add
# each gradient inside the GEMM node that computes it and zero the grads in
# AdamW's phase, so their figure leaves that work out: it is a lower bound
# of what they spent outside GEMMs and AdamW. Also prints each build's
# tokens/s and phases.
set -euo pipefail

ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-6}
CONFIG=${CONFIG:-124M}
B=${B:-4}
T=${T:-64}
SCHEDULE=${SCHEDULE:-schedules/gpt2.sched}
[ $# -ge 1 ] || { echo "usage: $0 BUILD_DIR..." >&2; exit 2; }

median() { sort -g | awk '{a[NR] = $1} END {if (NR % 2) print a[(NR + 1) / 2]; else printf "%.1f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

# outside MS, tokens/s, step phases from one profile's output on stdin.
parse() {
  awk '
    /^slapo model=/ { for (i = 1; i <= NF; i++) if ($i ~ /^tokens_per_s=/) { split($i, a, "="); tok = a[2] } }
    /^phases/ { for (i = 1; i <= NF; i++) if ($i == "norm") { clip = $(i + 1); sub(",", "", clip) }
                adamw = $NF }
    /^graph ms per step/ { graph = $NF == "ms" ? $(NF - 1) : $NF }
    $1 == "matmul" || $1 == "linear" { gemm += $2 }
    END { printf "%.1f %.1f %.1f\n", graph - gemm + clip, tok, adamw }'
}

declare -A OUT TOK
echo "# $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'); load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# $ROUNDS rounds of: bench_train --config $CONFIG --batch $B --seq $T --steps $STEPS --schedule $SCHEDULE --profile"
for r in $(seq "$ROUNDS"); do
  for b in "$@"; do
    read -r o t a < <(OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} "$b/bench_bench_train" --config "$CONFIG" \
      --batch "$B" --seq "$T" --steps "$STEPS" --schedule "$SCHEDULE" --profile | parse)
    echo "round $r  $b: outside GEMMs and AdamW $o ms, $t tokens/s, AdamW phase $a ms"
    OUT[$b]+="$o "
    TOK[$b]+="$t "
  done
done
first=$1
o0=$(tr ' ' '\n' <<<"${OUT[$first]}" | grep . | median)
printf "%-40s %12s %8s %10s\n" build "outside ms" ratio "tokens/s"
for b in "$@"; do
  o=$(tr ' ' '\n' <<<"${OUT[$b]}" | grep . | median)
  t=$(tr ' ' '\n' <<<"${TOK[$b]}" | grep . | median)
  printf "%-40s %12s %7.2fx %10s\n" "$b" "$o" "$(awk -v a="$o" -v b="$o0" 'BEGIN {print a / b}')" "$t"
done
