#!/usr/bin/env bash
# Runs every libFuzzer harness built in BUILD_DIR (fuzz_*) for SECONDS each,
# starting from the committed seeds in tests/fuzz/corpus/<name> (read only;
# new inputs go to BUILD_DIR/corpus/<name>). A crash, leak, sanitizer report,
# timeout (10 s an input) or memory blow-up (2 GiB RSS) fails the run and
# leaves the input in BUILD_DIR/artifacts; add it to the seeds and make it a
# regression test.
#   tools/run_fuzz.sh build-fuzz 60
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: run_fuzz.sh BUILD_DIR [SECONDS]}
secs=${2:-60}
shopt -s nullglob
harnesses=("$dir"/fuzz_*)
[ ${#harnesses[@]} -gt 0 ] || { echo "run_fuzz: no fuzz_* harness in $dir" >&2; exit 2; }
mkdir -p "$dir/artifacts"
status=0
for h in "${harnesses[@]}"; do
  name=$(basename "$h")
  name=${name#fuzz_}
  seeds=tests/fuzz/corpus/$name
  work=$dir/corpus/$name
  mkdir -p "$work"
  echo "run_fuzz: $name for ${secs} s (seeds: $seeds)"
  if ! ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    OMP_NUM_THREADS=1 "$h" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
    -print_final_stats=1 -artifact_prefix="$dir/artifacts/$name-" "$work" "$seeds" \
    > "$dir/$name.log" 2>&1; then
    tail -n 40 "$dir/$name.log" >&2
    echo "run_fuzz: $name FAILED; the input is in $dir/artifacts/ (log: $dir/$name.log)" >&2
    status=1
  else
    grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$dir/$name.log" | tr '\n' ' '
    echo
  fi
done
if [ "$status" -eq 0 ]; then echo "run_fuzz: ${#harnesses[@]} passed, 0 failed"; fi
exit "$status"
