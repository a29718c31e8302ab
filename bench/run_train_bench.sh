#!/usr/bin/env bash
# bench/run_train_bench.sh - GPT-2 training-step throughput, slapo against a
# plain PyTorch GPT-2 (bench/train_peer.py) of the same config, batch and
# sequence length, run side by side: for each round and config, slapo then
# the peer, so both see the same machine load. Prints every round (to show
# the noise) and a table of medians over the rounds with the ratio.
#
#   bench/run_train_bench.sh [BUILD_DIR]        (default: build)
#   ROUNDS=3 STEPS=10 CONFIGS="small:4:256 124M:4:64 llama/small:4:256" bench/run_train_bench.sh build-perf
#   a config may name its family first (llama/small); gpt2 otherwise
#   SCHEDULE=F adds slapo with that schedule (default: each family's
#   schedules/<family>.sched; empty: none)
#   BF16=1 adds a bf16 row: slapo with that schedule and --precision bf16
#   (the root autocast line) against the peer under torch.autocast("cpu",
#   torch.bfloat16); BF16=0 skips it. slapo's MFU in that row is quoted
#   against a measured 1024^3 bf16 GEMM peak and the f32 one. On a CPU
#   without bf16 units slapo widens bf16 GEMM operands to f32
#   (bf16_gemm=widened: the casts' cost, no speedup possible; `slapo train`
#   itself refuses bf16 there) and torch 1.13 runs its own bf16 fallback;
#   PEER_TIMEOUT (seconds, default 900) bounds each peer run, a run past it
#   is reported as such.
#
# Both sides use 2 threads. slapo runs as users run it: OMP_NUM_THREADS=2,
# nothing else set. The peer runs at its fastest settings measured on this
# machine (Debian's python3-torch 1.13; override with PEER_ENV / PEER_ARGS):
#   - torch.set_num_threads(2) (--threads 2), OMP_WAIT_POLICY=ACTIVE: torch
#     opens a parallel region per op; PASSIVE was 10-20% slower, unset
#     about equal to ACTIVE;
#   - ATEN_CPU_CAPABILITY: Debian's build picks AVX2 kernels unless told (it
#     reports "CPU capability usage: AVX2"), so the runner sets the best level
#     the CPU's flags in /proc/cpuinfo allow: avx512 only with avx512f, bw, vl
#     and dq, avx2 with avx2 and fma, else default. Never more than the CPU
#     has (forcing avx512 on an AVX2-only CPU dies with SIGILL). A value
#     already in the environment is kept, so a run can be capped on purpose:
#       SLAPO_MAX_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 \
#         bench/run_train_bench.sh
#     runs both sides' AVX2 kernels on an AVX-512 machine;
#   - OpenBLAS picks its kernels by core type, not by an ISA cap: the peer
#     runs with OPENBLAS_CORETYPE unset (OpenBLAS's own detection, e.g.
#     Cooperlake on an AVX-512 EPYC) or Haswell when ATEN_CPU_CAPABILITY caps
#     an AVX-512 CPU at avx2; PEER_OPENBLAS_CORETYPE names one. A value
#     inherited from the environment is not passed on (it says so): a
#     machine image here sets OPENBLAS_CORETYPE=Haswell, which made the
#     peer 1.4-1.5x slower on an AVX-512 EPYC (small B4 T256 1931 tok/s
#     Haswell, 2624 SkylakeX, 2910 Cooperlake; 124M B4 T64 95, 131, 146);
#   - an optimized BLAS: Debian's torch calls the system libblas.so.3, by
#     default netlib's reference BLAS (~5 GFLOP/s, single-threaded). When
#     Debian's OpenBLAS (libopenblas0-openmp, or -pthread) is installed the
#     peer loads it through LD_LIBRARY_PATH (~180 GFLOP/s on 2 threads here)
#     without changing the system default; otherwise it says it runs on the
#     system BLAS and the ratio flatters slapo;
#   - nn.Linear on that BLAS (--linear mm). --linear conv (each Linear as a
#     1x1 conv1d on oneDNN/MKL-DNN, torch.backends.mkldnn on) was 5-10%
#     slower on `small` and about equal on 124M;
#   - AdamW(foreach=False): torch 1.13's foreach (multi-tensor) AdamW took
#     ~700 ms a step on 124M here against ~290 ms for the per-tensor loop;
#     zero_grad(set_to_none=True) (False was no faster).
# The training step timed on both sides: forward, backward, the global
# norm clipped at 1.0, AdamW; the peer also zero_grad()s (slapo's step
# writes the gradients instead of adding them, so it needs no zeroing);
# random token ids (no tokenizer).
set -euo pipefail

BUILD=${1:-build}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-10}
CONFIGS=${CONFIGS:-"small:4:256 124M:4:64 llama/small:4:256"}
HERE=$(cd "$(dirname "$0")" && pwd)
SLAPO_BIN="$BUILD/bench_bench_train"
PY=${PY:-/usr/bin/python3}

if [[ ! -x $SLAPO_BIN ]]; then
  echo "run_train_bench: $SLAPO_BIN not found; build first (cmake --build $BUILD)" >&2
  exit 2
fi

BLAS_DIR=""
for d in /usr/lib/x86_64-linux-gnu/openblas-openmp /usr/lib/x86_64-linux-gnu/openblas-pthread; do
  if [[ -e $d/libblas.so.3 ]]; then BLAS_DIR=$d; break; fi
done
cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has() { for f in "$@"; do [[ $cpu_flags == *" $f "* ]] || return 1; done; }
if [[ -n ${ATEN_CPU_CAPABILITY:-} ]]; then
  ATEN_ISA=$ATEN_CPU_CAPABILITY
elif has avx512f avx512bw avx512vl avx512dq; then
  ATEN_ISA=avx512
elif has avx2 fma; then
  ATEN_ISA=avx2
else
  ATEN_ISA=default
fi
if [[ -n ${PEER_OPENBLAS_CORETYPE:-} ]]; then
  BLAS_CORE="OPENBLAS_CORETYPE=$PEER_OPENBLAS_CORETYPE"
elif [[ $ATEN_ISA == avx2 ]] && has avx512f; then
  BLAS_CORE="OPENBLAS_CORETYPE=Haswell"
else
  BLAS_CORE="-u OPENBLAS_CORETYPE"
  if [[ -n ${OPENBLAS_CORETYPE:-} ]]; then
    echo "# run_train_bench: OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE from the environment is not" \
      "passed to the peer (OpenBLAS detects its fastest core type; PEER_OPENBLAS_CORETYPE forces one)"
  fi
fi
if [[ -z ${PEER_ENV+x} ]]; then
  PEER_ENV="$BLAS_CORE OMP_WAIT_POLICY=ACTIVE ATEN_CPU_CAPABILITY=$ATEN_ISA"
  if [[ -n $BLAS_DIR ]]; then
    PEER_ENV="$PEER_ENV LD_LIBRARY_PATH=$BLAS_DIR"
  else
    echo "run_train_bench: no OpenBLAS found (apt-get install libopenblas0-openmp);" \
      "the peer runs on the system BLAS, which may be netlib's reference BLAS" >&2
  fi
fi
PEER_ARGS=${PEER_ARGS:-"--threads 2 --linear mm"}
BF16=${BF16:-1}
PEER_TIMEOUT=${PEER_TIMEOUT:-900}

field() { # field NAME LINE -> value of NAME=value in LINE
  tr ' ' '\n' <<<"$2" | sed -n "s/^$1=//p"
}

median() { # numbers on stdin -> median
  sort -g | awk '{a[NR] = $1} END {if (NR % 2) print a[(NR + 1) / 2]; else printf "%.1f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2}'
}

isa_flags=$(tr ' ' '\n' <<<"$cpu_flags" | grep -E '^(avx2|fma|avx512(f|bw|vl|dq|_bf16|_vnni)|amx_(tile|bf16))$' | tr '\n' ' ')
echo "# cpu: $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'); flags: ${isa_flags:-none of avx2/avx512/amx}"
OMP_NUM_THREADS=2 "$SLAPO_BIN" --machine
env $PEER_ENV "$PY" "$HERE/train_peer.py" --machine $PEER_ARGS
if [ "$BF16" = 1 ]; then
  env $PEER_ENV "$PY" "$HERE/train_peer.py" --gemm-probe $PEER_ARGS | sed 's/^/# /'
  env $PEER_ENV "$PY" "$HERE/train_peer.py" --gemm-probe --autocast bf16 $PEER_ARGS | sed 's/^/# /'
fi
echo "# slapo: OMP_NUM_THREADS=2 $SLAPO_BIN"
echo "# peer:  env $PEER_ENV $PY bench/train_peer.py $PEER_ARGS"
echo "# $ROUNDS rounds x {$CONFIGS}, $STEPS timed steps each (after 2 warm-up); machine: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
SCHEDULE=${SCHEDULE-default} # the scheduled slapo row (SCHEDULE= skips it)
sched_for() { # sched_for FAMILY -> the schedule file of the scheduled row
  if [ "$SCHEDULE" = default ]; then echo "$HERE/../schedules/$1.sched"; else echo "$SCHEDULE"; fi
}
split_cfg() { # split_cfg [FAMILY/]CONFIG -> "FAMILY CONFIG"
  if [[ $1 == */* ]]; then echo "${1%%/*} ${1#*/}"; else echo "gpt2 $1"; fi
}
declare -A S P MFU MFP PEAK MEAS OUT Q QMFU QMFP QPEAK QMEAS QOUT H HP HMFU HM32 HPEAK HMEAS HKIND HGF
for r in $(seq "$ROUNDS"); do
  for c in $CONFIGS; do
    IFS=: read -r fc b t <<<"$c"
    read -r fam cfg <<<"$(split_cfg "$fc")"
    sl=$(OMP_NUM_THREADS=2 "$SLAPO_BIN" --model "$fam" --config "$cfg" --batch "$b" --seq "$t" \
      --steps "$STEPS" | head -1)
    pl=$(env $PEER_ENV "$PY" "$HERE/train_peer.py" --model "$fam" --config "$cfg" --batch "$b" \
      --seq "$t" --steps "$STEPS" $PEER_ARGS)
    st=$(field tokens_per_s "$sl")
    pt=$(field tokens_per_s "$pl")
    S[$c]+="$st "
    P[$c]+="$pt "
    MFU[$c]+="$(field mfu "$sl") "
    MFP[$c]+="$(field mfu_paired "$sl") "
    PEAK[$c]=$(field planned_peak_mb "$sl")
    MEAS[$c]=$(field measured_peak_mb "$sl")
    OUT[$c]+="$(field non_gemm_share "$sl") "
    if [ -n "$SCHEDULE" ]; then
      ql=$(OMP_NUM_THREADS=2 "$SLAPO_BIN" --model "$fam" --config "$cfg" --batch "$b" --seq "$t" \
        --steps "$STEPS" --schedule "$(sched_for "$fam")" | head -1)
      Q[$c]+="$(field tokens_per_s "$ql") "
      QMFU[$c]+="$(field mfu "$ql") "
      QMFP[$c]+="$(field mfu_paired "$ql") "
      QPEAK[$c]=$(field planned_peak_mb "$ql")
      QMEAS[$c]=$(field measured_peak_mb "$ql")
      QOUT[$c]+="$(field non_gemm_share "$ql") "
      printf "round %d %-11s B%-2s T%-4s slapo+%s %8.1f tok/s (step %s ms, mfu %s, paired %s)\n" "$r" "$fc" \
        "$b" "$t" "$(basename "$(sched_for "$fam")")" "$(field tokens_per_s "$ql")" "$(field step_ms "$ql")" \
        "$(field mfu "$ql")" "$(field mfu_paired "$ql")"
    fi
    printf "round %d %-11s B%-2s T%-4s slapo %8.1f tok/s (step %s ms, mfu %s, paired %s, gemm peak %s GF/s)  peer %8.1f tok/s (step %s ms)\n" \
      "$r" "$fc" "$b" "$t" "$st" "$(field step_ms "$sl")" "$(field mfu "$sl")" "$(field mfu_paired "$sl")" \
      "$(field peak_gflops "$sl")" "$pt" "$(field step_ms "$pl")"
    if [ "$BF16" = 1 ]; then
      sched_arg=()
      [ -n "$SCHEDULE" ] && sched_arg=(--schedule "$(sched_for "$fam")")
      hl=$(OMP_NUM_THREADS=2 "$SLAPO_BIN" --model "$fam" --config "$cfg" --batch "$b" --seq "$t" \
        --steps "$STEPS" "${sched_arg[@]}" --precision bf16 | head -1)
      hp=$(timeout "$PEER_TIMEOUT" env $PEER_ENV "$PY" "$HERE/train_peer.py" --model "$fam" --config "$cfg" \
        --batch "$b" --seq "$t" --steps "$STEPS" --autocast bf16 $PEER_ARGS || echo "tokens_per_s=nan timeout")
      H[$c]+="$(field tokens_per_s "$hl") "
      HP[$c]+="$(field tokens_per_s "$hp") "
      HMFU[$c]+="$(field mfu "$hl") "
      HM32[$c]+="$(field mfu_f32 "$hl") "
      HPEAK[$c]=$(field planned_peak_mb "$hl")
      HMEAS[$c]=$(field measured_peak_mb "$hl")
      HKIND[$c]=$(field bf16_gemm "$hl")
      HGF[$c]+="$(field peak_gflops "$hl") "
      printf "round %d %-11s B%-2s T%-4s slapo bf16 %8.1f tok/s (step %s ms, gemm %s, bf16 peak %s GF/s)  peer bf16 %8s tok/s (step %s ms)\n" \
        "$r" "$fc" "$b" "$t" "$(field tokens_per_s "$hl")" "$(field step_ms "$hl")" "${HKIND[$c]}" \
        "$(field peak_gflops "$hl")" "$(field tokens_per_s "$hp")" "$(field step_ms "$hp")"
    fi
  done
done

echo
printf "%-11s %3s %5s | %12s %12s %7s | %11s %9s | %11s %11s\n" config B T "slapo tok/s" "torch tok/s" \
  ratio "MFU / pair" "non-GEMM" "planned MB" "measured MB"
for c in $CONFIGS; do
  IFS=: read -r cfg b t <<<"$c"
  sm=$(tr ' ' '\n' <<<"${S[$c]}" | grep . | median)
  pm=$(tr ' ' '\n' <<<"${P[$c]}" | grep . | median)
  mm=$(tr ' ' '\n' <<<"${MFU[$c]}" | grep . | median)
  mp=$(tr ' ' '\n' <<<"${MFP[$c]}" | grep . | median)
  om=$(tr ' ' '\n' <<<"${OUT[$c]}" | grep . | median)
  printf "%-11s %3s %5s | %12.1f %12.1f %6.2fx | %5.3f %5.3f %8.1f%% | %11s %11s\n" "$cfg" "$b" "$t" "$sm" "$pm" \
    "$(awk -v a="$sm" -v b="$pm" 'BEGIN {print a / b}')" "$mm" "$mp" "$(awk -v a="$om" 'BEGIN {print 100 * a}')" \
    "${PEAK[$c]}" "${MEAS[$c]}"
done
echo "(medians over $ROUNDS rounds; ratio = slapo / torch; MFU = (6N + 12LTC) * tokens/s / measured 1024^3 GEMM peak"
echo " (its best sample in the run); pair = each step's MFU against the GEMM sample right after it (median);"
echo " non-GEMM = share of the step outside the GEMM nodes, AdamW included; activation peaks planned and measured)"
if [ -n "$SCHEDULE" ]; then
  echo
  printf "%-11s %3s %5s | %14s %12s %9s %9s | %11s %9s | %11s %11s\n" config B T "scheduled tok/s" \
    "torch tok/s" "vs torch" "vs plain" "MFU / pair" "non-GEMM" "planned MB" "measured MB"
  for c in $CONFIGS; do
    IFS=: read -r cfg b t <<<"$c"
    sm=$(tr ' ' '\n' <<<"${S[$c]}" | grep . | median)
    pm=$(tr ' ' '\n' <<<"${P[$c]}" | grep . | median)
    qm=$(tr ' ' '\n' <<<"${Q[$c]}" | grep . | median)
    mm=$(tr ' ' '\n' <<<"${QMFU[$c]}" | grep . | median)
    mp=$(tr ' ' '\n' <<<"${QMFP[$c]}" | grep . | median)
    om=$(tr ' ' '\n' <<<"${QOUT[$c]}" | grep . | median)
    printf "%-11s %3s %5s | %14.1f %12.1f %8.2fx %8.2fx | %5.3f %5.3f %8.1f%% | %11s %11s\n" "$cfg" "$b" "$t" \
      "$qm" "$pm" "$(awk -v a="$qm" -v b="$pm" 'BEGIN {print a / b}')" \
      "$(awk -v a="$qm" -v b="$sm" 'BEGIN {print a / b}')" "$mm" "$mp" "$(awk -v a="$om" 'BEGIN {print 100 * a}')" \
      "${QPEAK[$c]}" "${QMEAS[$c]}"
  done
  echo "(slapo with $( [ "$SCHEDULE" = default ] && echo "each family's default schedule" || echo "$SCHEDULE"); vs plain = scheduled / unscheduled slapo, same rounds)"
fi
if [ "$BF16" = 1 ]; then
  echo
  printf "%-11s %3s %5s | %11s %9s %11s %9s | %11s %9s %8s | %15s %15s\n" config B T "bf16 tok/s" \
    "vs f32" "torch bf16" "vs torch" "MFU bf16/f32" "GEMM" "GF/s" "planned MB" "measured MB"
  for c in $CONFIGS; do
    IFS=: read -r cfg b t <<<"$c"
    base=${Q[$c]:-${S[$c]}} base_peak=${QPEAK[$c]:-${PEAK[$c]}} base_meas=${QMEAS[$c]:-${MEAS[$c]}}
    fm=$(tr ' ' '\n' <<<"$base" | grep . | median)
    hm=$(tr ' ' '\n' <<<"${H[$c]}" | grep . | median)
    hp=$(tr ' ' '\n' <<<"${HP[$c]}" | grep -v nan | grep . | median || true)
    mm=$(tr ' ' '\n' <<<"${HMFU[$c]}" | grep . | median)
    m3=$(tr ' ' '\n' <<<"${HM32[$c]}" | grep . | median)
    gf=$(tr ' ' '\n' <<<"${HGF[$c]}" | grep . | sort -g | tail -1)
    printf "%-11s %3s %5s | %11.1f %8.2fx %11s %9s | %5.3f %5.3f %9s %8.1f | %7s/%-7s %7s/%-7s\n" "$cfg" "$b" "$t" \
      "$hm" "$(awk -v a="$hm" -v b="$fm" 'BEGIN {print a / b}')" "${hp:-n/a}" \
      "$( [ -n "$hp" ] && awk -v a="$hm" -v b="$hp" 'BEGIN {printf "%.2fx", a / b}' || echo n/a)" \
      "$mm" "$m3" "${HKIND[$c]}" "$gf" "$base_peak" "${HPEAK[$c]}" "$base_meas" "${HMEAS[$c]}"
  done
  echo "(slapo --precision bf16 with $( [ -n "$SCHEDULE" ] && echo "the schedule above" || echo "no schedule"); vs f32 = bf16 / the same"
  echo " slapo in f32; torch bf16 = the peer under torch.autocast (n/a: every run past PEER_TIMEOUT);"
  echo " MFU against the run's bf16 GEMM peak / the f32 one; GEMM: native = bf16 hardware, widened = operands"
  echo " widened to f32 (no bf16 units: no speedup possible); MB: activation peaks f32/bf16)"
fi
