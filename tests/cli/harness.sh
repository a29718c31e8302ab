# tests/cli/harness.sh - sourced by the CLI test scripts: a scratch $TMP
# (removed on exit), and run / check / ok / summary, which count passed and
# failed checks. Set HARNESS_NAME, then source it (it sets TMP, OUT,
# ERR). RUN_TIMEOUT (seconds, 0 = none) bounds each command.
TMP=$(mktemp -d "${TMPDIR:-/tmp}/slapo_${HARNESS_NAME:-test}_XXXXXX")
trap 'rm -rf "$TMP"' EXIT
passed=0
failed=0
OUT="$TMP/out"
ERR="$TMP/err"
rc_ok=0

# run NAME WANT_RC CMD... : runs the command, keeps stdout/stderr, checks the
# exit code (WANT_RC "nonzero": any failure but timeout's 124).
run() {
  local name=$1 want=$2
  shift 2
  timeout "${RUN_TIMEOUT:-0}" "$@" >"$OUT" 2>"$ERR"
  local rc=$?
  if { [ "$want" = nonzero ] && [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ]; } || [ "$rc" = "$want" ]; then
    rc_ok=1
  else
    rc_ok=0
    echo "FAIL $name: exit $rc, want $want"
    echo "  stderr: $(head -c 600 "$ERR")"
  fi
}

# check NAME FILE TEXT : the last run's FILE ("out" or "err") contains TEXT.
check() {
  local name=$1 file=$2 text=$3
  if [ "$rc_ok" -eq 1 ] && grep -qF -- "$text" "$TMP/$file"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    [ "$rc_ok" -eq 1 ] && echo "FAIL $name: $file lacks '$text': $(head -c 600 "$TMP/$file")"
  fi
}

# ok NAME : the last run's exit code was right (no text to check).
ok() {
  if [ "$rc_ok" -eq 1 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
}

# The tally; the script's exit status.
summary() {
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ]
}
