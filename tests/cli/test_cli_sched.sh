#!/usr/bin/env bash
# tests/cli/test_cli_sched.sh - the schedule side of the `slapo` command:
# `primitives` and `help <primitive>`, `show --schedule` (numbered steps with
# file:line, --disable), parse errors as file:line:col, `verify` (bitwise for
# checkpoint, exit 1 for a broken schedule), `train --schedule`, and traced
# graphs: `show --graph` (text and --dot) and `find` (--pattern, --regex).
# Usage: test_cli_sched.sh path/to/slapo path/to/source-root
# Prints "N passed, M failed" and exits non-zero when any check fails.
set -u

SLAPO=${1:?usage: test_cli_sched.sh path/to/slapo path/to/source-root}
SRC=${2:?usage: test_cli_sched.sh path/to/slapo path/to/source-root}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
HARNESS_NAME=test_cli_sched
source "$(dirname "$0")/harness.sh"
cd "$SRC" || exit 1 # schedules/ paths as users type them

FA=schedules/gpt2_flash_attention.sched
CK=schedules/gpt2_checkpoint.sched

# ---- primitives, help ----
run "primitives" 0 "$SLAPO" primitives
for p in replace replace_all annotate checkpoint; do
  check_re "primitives lists $p" out "^$p +[a-z]"
done
check_re "primitives lists replacement modules" out "^FlashAttention +"

run "help checkpoint" 0 "$SLAPO" help checkpoint
check_re "help checkpoint: signature" out "^checkpoint \[ratio=r( \| pattern=P)?\]"
check_re "help checkpoint: C form" out "slapo_checkpoint\(node"
check_re "help checkpoint: preconditions" out "Fails: INVALID_ARG"
check_re "help checkpoint: verification" out "Verified: bitwise"
for p in replace replace_all annotate; do
  run "help $p" 0 "$SLAPO" help "$p"
  check_re "help $p: doc" out "^  Fails: "
done

# A command's name gives its options, as does -h after it.
run "help train" 0 "$SLAPO" help train
check "help train" out "usage: slapo train"
run "verify -h" 0 "$SLAPO" verify -h
check "verify -h" out "usage: slapo verify"
# Every command 'slapo help' lists takes 'help <command>' (version and help
# did not: "no primitive or command 'version'").
run "help: command list" 0 "$SLAPO" help
cmds=$(sed -n 's/^  \([a-z]\+\) \+[a-z].*/\1/p' "$OUT" | sort -u)
[ "$(echo "$cmds" | wc -l)" -ge 10 ] && passed=$((passed + 1)) ||
  { failed=$((failed + 1)); echo "FAIL help: command list: $cmds"; }
for c in $cmds; do
  run "help $c" 0 "$SLAPO" help "$c"
  check "help $c" out "usage: slapo $c"
  run "$c --help" 0 "$SLAPO" "$c" --help
  check "$c --help" out "usage: slapo $c"
done
run "version extra arg" 2 "$SLAPO" version now
check "version extra arg" err "unexpected argument 'now'"
run "primitives extra arg" 2 "$SLAPO" primitives now
check "primitives extra arg" err "unexpected argument 'now'"
run "--version" 0 "$SLAPO" --version
check_re "--version" out "^slapo [0-9]"

run "verify bisect and final-only" 2 "$SLAPO" verify --schedule "$FA" --bisect --final-only
check "verify bisect and final-only" err "give one of them"

run "help glob" 0 "$SLAPO" help glob
check "help glob" out "{0..5}   each integer in the range, inclusive"
check "help glob: every index" out "every index must match a module"
run "help pattern" 0 "$SLAPO" help pattern
check "help pattern" out "let a = add(x, y); mul(a, a)"

run "help bogus" 1 "$SLAPO" help bogus
check_re "help bogus: message" err "^slapo: not_found: no primitive or command 'bogus'"

# ---- show --schedule ----
run "show" 0 "$SLAPO" show --config tiny --schedule "$FA"
check_re "show: step count" out "^schedule $FA: 5 steps$"
for i in 0 1 2 3; do
  check_re "show: step $((i + 1))" out \
    "^$((i + 1)) +transformer\.h\.$i\.attn +replace +FlashAttention +# $FA:3$"
done
check_re "show: step 5" out "^5 +transformer\.h +checkpoint +ratio=1\.0 +# $FA:4$"
check_re "show: applied log" out "^transformer\.h\.3\.attn +replace +FlashAttention$"
check_re "show: scheduled tree" out "\(attn\): FlashAttention\("

run "show --disable" 0 "$SLAPO" show --config tiny --schedule "$FA" --disable 1,2
check_re "show --disable: steps still numbered" out "^1 +transformer\.h\.0\.attn +replace"
check_re "show --disable: count" out "^applied \(2 disabled\):$"
sed -n '/^applied/,$p' "$OUT" >"$TMP/applied"
check_re "show --disable: step 3 applied" "$TMP/applied" "^transformer\.h\.2\.attn +replace +FlashAttention$"
check_re "show --disable: step 5 applied" "$TMP/applied" "^transformer\.h +checkpoint +ratio=1\.0$"
lacks "show --disable: step 1 skipped" "$TMP/applied" "^transformer\.h\.0\.attn +replace"
lacks "show --disable: step 2 skipped" "$TMP/applied" "^transformer\.h\.1\.attn +replace"
check_re "show --disable: h.0-1 keep GPT2Attention" "$TMP/applied" "\(attn\): GPT2Attention\("
# A step that fails after a disabled one says which it may need.
printf 'transformer.h.0 trace flatten=true\ntransformer.h.0 fuse pattern="gelu(add(x, b))" compiler=none name=F\n' >"$TMP/needs_trace.sched"
run "disabled trace" 1 "$SLAPO" show --config tiny --schedule "$TMP/needs_trace.sched" --disable 1
check "disabled trace: names it" err "(this step may need disabled step 1)"

printf '# bad\ntransformer.h checkpoint ratio=0.5.1\n' >"$TMP/malformed.sched"
run "show malformed" 1 "$SLAPO" show --config tiny --schedule "$TMP/malformed.sched"
check_re "show malformed: file:line:col" err "^slapo: parse: $TMP/malformed\.sched:2:[0-9]+: expected a number"
lacks "show malformed: nothing applied" out "^applied"

# What a flattened trace holds cannot change under it afterwards: its graph
# and edits would describe the old module (the stale graph ran at the traced
# shapes, the new module at others).
printf 'transformer.h.* trace flatten=true\ntransformer replace_all GPT2Attention FlashAttention\n' \
  >"$TMP/replace_all_after_trace.sched"
run "replace_all after trace" 1 "$SLAPO" show --config tiny --schedule "$TMP/replace_all_after_trace.sched"
check "replace_all after trace" err "replace_all_after_trace.sched:2: replace_all: transformer.h.0.attn is inlined into the flattened trace of transformer.h.0"
printf 'transformer.h.0 trace flatten=true\ntransformer.h.0.mlp.c_fc decompose\n' >"$TMP/decompose_after_trace.sched"
run "decompose after trace" 1 "$SLAPO" show --config tiny --schedule "$TMP/decompose_after_trace.sched"
check "decompose after trace" err "decompose_after_trace.sched:2: decompose: transformer.h.0.mlp.c_fc is a module call in the flattened trace of transformer.h.0"

# A graph primitive or find on a module inlined into a flattened trace points
# at the traced ancestor.
printf 'transformer.h.0 trace flatten=true\ntransformer.h.0.mlp fuse_all compiler=cc\n' \
  >"$TMP/fuse_all_inlined.sched"
run "fuse_all on an inlined module" 1 "$SLAPO" show --config tiny --schedule "$TMP/fuse_all_inlined.sched"
check "fuse_all on an inlined module" err "fuse_all: transformer.h.0.mlp is inlined into the flattened trace of transformer.h.0; apply fuse_all to transformer.h.0"
run "find in an inlined module" 1 "$SLAPO" find --config tiny --schedule schedules/gpt2_trace_checkpoint.sched \
  --pattern 'gelu(x)' transformer.h.0.mlp
check "find in an inlined module" err "find: transformer.h.0.mlp is inlined into the flattened trace of transformer.h.0; find in transformer.h.0"

# Paths are matched before any line applies: a module fuse creates has none.
printf 'transformer.h.0.mlp.c_fc decompose\ntransformer.h.0 trace flatten=true
transformer.h.0 fuse pattern="gelu(add(x, b))" compiler=cc name=F\ntransformer.h.0.F_0 checkpoint\n' \
  >"$TMP/created.sched"
run "created module path" 1 "$SLAPO" show --config tiny --schedule "$TMP/created.sched"
check "created module path" err "created.sched:4: no module matches 'transformer.h.0.F_0'"
check "created module path: why" err "a module an earlier line creates cannot be named"

printf 'transformer.h.0.mlp.c_fc decompose\ntransformer.h.0 trace flatten=true
transformer.h.0 fuse pattern="gelu(add(x, b))" compiler=cc name=a.b\n' >"$TMP/fuse_name.sched"
run "fuse name not an identifier" 1 "$SLAPO" show --config tiny --schedule "$TMP/fuse_name.sched"
check "fuse name not an identifier" err "fuse_name.sched:3: fuse: transformer.h.0: name 'a.b' must be an identifier"
printf 'transformer.h.0.attn replace FusedLinear\n' >"$TMP/subgraph_name.sched"
run "replace with a subgraph module" 1 "$SLAPO" show --config tiny --schedule "$TMP/subgraph_name.sched"
check "replace with a subgraph module" err "'FusedLinear' is a subgraph module"

printf 'transformer.h.9 checkpoint\n' >"$TMP/nomatch.sched"
run "show glob without match" 1 "$SLAPO" show --config tiny --schedule "$TMP/nomatch.sched"
check_re "show glob without match: message" err "^slapo: no_match: $TMP/nomatch\.sched:1: .*transformer\.h\.9"
# A range that overshoots in part fails as one that matches nothing does
# (it silently trained the 4 layers that exist).
printf 'bert.encoder.layer.{0..9} trace\n' >"$TMP/overshoot.sched"
run "range overshoot" 1 "$SLAPO" verify --model bert --config tiny --schedule "$TMP/overshoot.sched"
check "range overshoot: message" err "overshoot.sched:1: no module matches 'bert.encoder.layer.{0..9}' at indices 4..9 of the range {0..9}: the model has 'bert.encoder.layer.{0..3}'"

# ---- verify ----
run "verify checkpoint" 0 "$SLAPO" verify --schedule "$CK"
check_re "verify checkpoint: bitwise" out "^steps 1-1 .*$CK:3 transformer\.h checkpoint\): equal bitwise$"
check_re "verify checkpoint: ok" out "^verify: ok$"

run "verify flash attention" 0 "$SLAPO" verify --schedule "$FA" --batch 1 --seq 8 --final-only
check_re "verify flash attention: tolerance" out "^steps 1-5 .*: within tolerance"

printf 'transformer.h.0 checkpoint\ntransformer.h.1 frobnicate\n' >"$TMP/broken.sched"
run "verify broken" 1 "$SLAPO" verify --schedule "$TMP/broken.sched"
check_re "verify broken: message" err "^slapo: not_found: $TMP/broken\.sched:2: unknown primitive 'frobnicate'"

# ---- train --schedule ----
for i in $(seq 40); do
  echo "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins."
done >"$TMP/corpus.txt"
run "train --schedule" 0 "$SLAPO" train --config tiny --steps 2 --batch 1 --seq 8 --sample 0 \
  --data "$TMP/corpus.txt" --schedule "$FA"
check_re "train --schedule: applied" out "applied 5 steps"
check_re "train --schedule: steps ran" out "^step 2/2 loss [0-9.]+"

run "train --schedule --disable" 0 "$SLAPO" train --config tiny --steps 1 --batch 1 --seq 8 \
  --sample 0 --data "$TMP/corpus.txt" --schedule "$FA" --disable 5
check_re "train --disable: count" out "applied 4 steps \(1 disabled\)"

# ---- traced graphs: show --graph, find ----
printf 'transformer.h.0.mlp trace\n' >"$TMP/trace_mlp.sched"
printf 'transformer.h.0 trace flatten=true\n' >"$TMP/trace_flat.sched"

run "show --graph" 0 "$SLAPO" show --graph transformer.h.0.mlp --config tiny \
  --schedule "$TMP/trace_mlp.sched"
check_re "show --graph: header" out "^graph of transformer\.h\.0\.mlp \(GPT2MLP\), traced flatten=false"
check_re "show --graph: c_fc" out "call_module c_fc\("
check_re "show --graph: act" out "call_module act\("
check_re "show --graph: shapes" out "^%c_fc : f32\[2, 8, 512\] = "
lacks "show --graph: no module tree" out "^total: "

run "show --graph flattened" 0 "$SLAPO" show --graph transformer.h.0 --config tiny \
  --schedule "$TMP/trace_flat.sched"
check_re "show --graph flattened: header" out "^graph of transformer\.h\.0 \(GPT2Block\), traced flatten=true"
check_re "show --graph flattened: matmul" out "call_op matmul"
check_re "show --graph flattened: module paths" out "call_module mlp\.c_fc\(.*# mlp$"
check_re "show --graph flattened: what a call runs" out "^  %mlp_c_fc: Linear\(in_features=128"

# A fused child says which backend runs it.
printf 'transformer.h.0.mlp.c_fc decompose\ntransformer.h.0 trace flatten=true\ntransformer.h.0 fuse pattern="gelu(add(x, b))" compiler=auto name=BiasGeLU\n' >"$TMP/auto.sched"
run "show --graph fused auto" 0 "$SLAPO" show --graph transformer.h.0 --config tiny \
  --schedule "$TMP/auto.sched"
check_re "show --graph: backend of a fused call" out "^  %BiasGeLU_0: BiasGeLU\(compiler=auto, ops=add\+gelu, runs=cc\)"

run "show --graph --dot" 0 "$SLAPO" show --graph transformer.h.0 --config tiny \
  --schedule "$TMP/trace_flat.sched" --dot "$TMP/out.dot"
check_re "show --dot: says where" out "^show: wrote $TMP/out\.dot"
check_re "show --dot: digraph" "$TMP/out.dot" "^digraph"
if command -v dot >/dev/null 2>&1; then
  run "dot -Tsvg" 0 dot -Tsvg "$TMP/out.dot" -o "$TMP/out.svg"
  check_re "dot -Tsvg: svg" "$TMP/out.svg" "<svg"
else
  echo "skip dot -Tsvg: graphviz not installed"
fi

run "show --graph untraced" 1 "$SLAPO" show --graph transformer.h.1 --config tiny \
  --schedule "$TMP/trace_flat.sched"
check_re "show --graph untraced: message" err \
  "^slapo: precond: transformer\.h\.1 is not traced; add 'transformer\.h\.1 trace' to the schedule$"
# A ModuleList is never called (its parent iterates over it): its items are.
run "show --graph list" 1 "$SLAPO" show --graph transformer.h --config tiny
check "show --graph list: message" err "add 'transformer.h.* trace' to the schedule (a ModuleList"
printf 'transformer.h trace\n' > "$TMP/trace_list.sched"
run "trace a list" 1 "$SLAPO" show --config tiny --schedule "$TMP/trace_list.sched"
check "trace a list: message" err "transformer.h is a ModuleList, a container its parent iterates over without calling it: trace its items ('transformer.h.* trace')"
run "show --graph inlined" 1 "$SLAPO" show --graph transformer.h.0.mlp --config tiny \
  --schedule "$TMP/trace_flat.sched"
check_re "show --graph inlined: names the trace" err "inlined into the flattened trace of transformer\.h\.0"
run "show --graph missing" 1 "$SLAPO" show --graph transformer.h.9 --config tiny \
  --schedule "$TMP/trace_flat.sched"
check_re "show --graph missing: names it" err "^slapo: not_found: no module 'transformer\.h\.9'"
run "show --dot without --graph" 2 "$SLAPO" show --config tiny --dot "$TMP/x.dot"
check_re "show --dot without --graph: message" err "--dot needs --graph"

run "find --pattern" 0 "$SLAPO" find --config tiny --schedule "$TMP/trace_flat.sched" \
  --pattern 'gelu(linear(x, w, b))' transformer.h.0
check_re "find --pattern: nodes" out "^match 1: %mlp_c_fc \(mlp\.c_fc\), %mlp_act \(mlp\.act\)$"
check_re "find --pattern: inputs" out "^  inputs: x=%ln_2 f32\[2, 8, 128\], w=mlp\.c_fc\.weight f32\[512, 128\]"
check_re "find --pattern: summary" out "^1 match of 'gelu\(linear\(x, w, b\)\)' in transformer\.h\.0$"

run "find --regex" 0 "$SLAPO" find --config tiny --schedule "$TMP/trace_flat.sched" \
  --regex 'c_.*' transformer.h.0
check_re "find --regex: attn.c_attn" out "^match 1: %attn_c_attn \(attn\.c_attn\)$"
check_re "find --regex: summary" out "^4 matches of regex 'c_\.\*' in transformer\.h\.0$"

run "find untraced" 1 "$SLAPO" find --config tiny --schedule "$TMP/trace_flat.sched" \
  --pattern 'gelu(x)' transformer.h.1
check_re "find untraced: message" err "^slapo: precond: .*transformer\.h\.1 is not traced; trace it first"
run "find bad pattern" 1 "$SLAPO" find --config tiny --schedule "$TMP/trace_flat.sched" \
  --pattern 'gelu(linear(x, w b))' transformer.h.0
check_re "find bad pattern: column" err "^slapo: parse: pattern 'gelu\(linear\(x, w b\)\)': column [0-9]+: expected"
run "find unknown name" 1 "$SLAPO" find --config tiny --schedule "$TMP/trace_flat.sched" \
  --pattern nosuch transformer.h.0
check_re "find unknown name: message" err "^slapo: not_found: --pattern 'nosuch': no pattern is registered"
run "find without pattern" 2 "$SLAPO" find --config tiny --schedule "$TMP/trace_flat.sched" transformer.h.0
check_re "find without pattern: message" err "give one of --pattern P and --regex RE"
run "find without path" 2 "$SLAPO" find --config tiny --regex 'c_.*'
check_re "find without path: message" err "a module PATH is required"
run "help lists find" 0 "$SLAPO" help
check_re "help lists find: line" out "^  find +list the matches"

TC=schedules/gpt2_trace_checkpoint.sched
run "find on $TC" 0 "$SLAPO" find --config tiny --schedule "$TC" --regex 'mlp\.act' transformer.h.3
check_re "find on $TC: block 3 traced" out "^1 match of regex"

# Every schedule file in the repository keeps the model's numerics (dropout
# on; tolerance where a primitive changes arithmetic). A file names its
# family first (gpt2_checkpoint.sched, llama.sched). The kernel cache of
# fused ones goes to the test's scratch directory.
for f in schedules/*.sched; do
  family=$(basename "$f" .sched)
  family=${family%%_*}
  run "verify $f" 0 env SLAPO_CACHE_DIR="$TMP/cache" "$SLAPO" verify --model "$family" \
    --config tiny --schedule "$f"
  check_re "verify $f: ok" out "^verify: ok"
done
# ... and in bf16 (--precision bf16: the root autocast line first), each
# file's final prefix in verify's three parts. The tensor-parallel files are
# verified in bf16 on 2 ranks (tests/dist/test_tensor_parallel.c).
for f in schedules/*.sched; do
  case "$f" in *_tp*) continue ;; esac
  family=$(basename "$f" .sched)
  family=${family%%_*}
  run "verify bf16 $f" 0 env SLAPO_CACHE_DIR="$TMP/cache" "$SLAPO" verify --model "$family" \
    --config tiny --schedule "$f" --precision bf16 --final-only
  check_re "verify bf16 $f: ok" out "^verify: ok"
done

summary
