#!/usr/bin/env bash
# Fails when a file includes a header of a layer it does not depend on
# (DESIGN.md §2), or another layer's private header. A public header
# include/slapo/<layer>.h or include/slapo/<layer>/x.h belongs to <layer>;
# a private one, src/<layer>/x.h (included as "<layer>/x.h"), may be
# included from <layer> alone: what other layers use is public. Run from
# anywhere.
set -euo pipefail
cd "$(dirname "$0")/.."

# Direct dependencies; the check uses their transitive closure.
declare -A DEPS=(
  [core]=""
  [tensor]="core"
  [ir]="tensor"
  [ops]="ir"
  [autograd]="ops"
  [exec]="ops"
  [rewrite]="ops"
  [module]="autograd exec rewrite"
  [pattern]="module"
  [compiler]="ir ops rewrite"
  [dist]="exec"
  [schedule]="module"
  [primitives]="schedule pattern compiler dist"
  [apply]="primitives"
  [models]="apply"
  [tokenizer]="core"
  [train]="models tokenizer"
  [cli]="train"
)

closure() { # prints the layer and everything below it
  local seen=" $1 " todo="$1" l d
  while [ -n "$todo" ]; do
    l=${todo%% *}; todo=${todo#"$l"}; todo=${todo# }
    for d in ${DEPS[$l]}; do
      case "$seen" in *" $d "*) ;; *) seen="$seen$d "; todo="$todo $d"; todo=${todo# };; esac
    done
  done
  echo "$seen"
}

layer_of_header() { # slapo/ops.h, slapo/ops/math.h, ops/kernels.h -> ops ; slapo.h -> cli
  local h=$1
  case "$h" in
    slapo.h) echo cli ;;
    slapo/*/*) h=${h#slapo/}; echo "${h%%/*}" ;;
    slapo/*) h=${h#slapo/}; echo "${h%.h}" ;;
    */*) echo "${h%%/*}" ;;
    *) echo "" ;;
  esac
}

bad=0
check_file() { # file layer
  local f=$1 layer=$2 allowed inc l
  [ -n "${DEPS[$layer]+x}" ] || { echo "check_layers: $f: unknown layer '$layer'"; bad=1; return; }
  allowed=$(closure "$layer")
  while IFS= read -r inc; do
    l=$(layer_of_header "$inc")
    [ -z "$l" ] && continue
    [ -n "${DEPS[$l]+x}" ] || continue # not a layer header (e.g. common/failalloc.h)
    case "$inc" in
      slapo/* | slapo.h | core/assert.h) ;; # core/assert.h: the library's one shared private header
      *) [ "$l" = "$layer" ] || {
           echo "check_layers: $f (layer $layer) includes \"$inc\", a private header of layer $l (make it public under include/slapo/$l/ or stop using it)"
           bad=1
           continue
         } ;;
    esac
    case "$allowed" in
      *" $l "*) ;;
      *) echo "check_layers: $f (layer $layer) includes \"$inc\" (layer $l), which it does not depend on"; bad=1 ;;
    esac
  done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f")
}

for f in $(find src -name '*.c' -o -name '*.cc' -o -name '*.h' -o -name '*.def' | sort); do
  layer=${f#src/}; layer=${layer%%/*}
  check_file "$f" "$layer"
done
for f in $(find include/slapo -name '*.h' | sort); do
  layer=${f#include/slapo/}; layer=${layer%%/*}; layer=${layer%.h}
  check_file "$f" "$layer"
done
[ $bad -eq 0 ] && echo "check_layers: ok"
exit $bad
