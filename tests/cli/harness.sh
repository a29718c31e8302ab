# tests/cli/harness.sh - sourced by the CLI test scripts: a scratch $TMP
# (removed on exit), and run / check / check_re / lacks / ok / summary,
# which count passed and failed checks: a run with the wrong exit code
# counts one failure, and the checks of its output are then skipped. Set
# HARNESS_NAME, then source it (it sets TMP, OUT, ERR). RUN_TIMEOUT
# (seconds, 0 = none) bounds each command.
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
    failed=$((failed + 1))
    echo "FAIL $name: exit $rc, want $want"
    echo "  stdout: $(head -c 400 "$OUT")"
    echo "  stderr: $(head -c 600 "$ERR")"
  fi
}

# The file a check reads: "out" and "err" are the last run's, else a path.
file_of() {
  case "$1" in out) echo "$OUT" ;; err) echo "$ERR" ;; *) echo "$1" ;; esac
}

# expect NAME FILE WHAT MODE ARG : one check of FILE (grep MODE -F or -E),
# passing when a line matches (WHAT "has") or none does (WHAT "lacks").
expect() {
  local name=$1 f what=$3 mode=$4 arg=$5
  f=$(file_of "$2")
  [ "$rc_ok" -eq 1 ] || return 0 # the run's failure is counted once
  if grep -q "$mode" -- "$arg" "$f"; then [ "$what" = has ]; else [ "$what" = lacks ]; fi
  if [ $? -eq 0 ]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAIL $name: $2 $([ "$what" = has ] && echo lacks || echo has) '$arg': $(head -c 600 "$f")"
  fi
}

# check NAME FILE TEXT : FILE contains TEXT (fixed string).
check() { expect "$1" "$2" has -F "$3"; }
# check_re NAME FILE REGEX : a line of FILE matches the extended REGEX.
check_re() { expect "$1" "$2" has -E "$3"; }
# lacks NAME FILE REGEX : no line of FILE matches REGEX.
lacks() { expect "$1" "$2" lacks -E "$3"; }

# ok NAME : the last run's exit code was right (no text to check).
ok() {
  if [ "$rc_ok" -eq 1 ]; then passed=$((passed + 1)); fi
}

# The tally; the script's exit status.
summary() {
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ]
}
