#!/usr/bin/env bash
# Fresh-root check: runs exactly the README's set-up commands (`make test`,
# then `make run`, shortened with RUN_STEPS) inside a brand-new Debian 12 root,
# so a missing install step fails here instead of hiding behind packages that a
# developer's or CI's machine already has.
#
#   tools/fresh_root_check.sh            # from anywhere inside the clone, as root
#
# Only a clean debootstrap base (Debian 12, minbase) is cached, outside the
# clone, in $SLAPO_FRESH_BASE (default /var/cache/slapo/bookworm-base); it is
# rebuilt when missing or broken. Every run copies that base into a scratch
# root, copies the clone's files in (tracked and untracked-but-not-ignored,
# no build outputs), installs `make` (the README's one prerequisite) and runs
# the README's commands with chroot. The scratch root and its mounts are
# removed on every exit path, so no run sees what an earlier one installed.
#
# From the host, only what apt needs to reach its mirrors goes in:
#   /etc/resolv.conf, /etc/apt/sources.list, /etc/apt/sources.list.d/*.{list,sources},
#   /etc/apt/apt.conf.d/* files that set Acquire:: options (proxies, validity),
#   /etc/apt/auth.conf and auth.conf.d/*, and the keyrings the sources name
#   with Signed-By; the proxy variables (http_proxy, https_proxy, no_proxy).
#
# Environment: RUN_STEPS (steps of the shortened `make run`, default 20),
# SLAPO_FRESH_BASE (cache), SLAPO_FRESH_SCRATCH (parent of the scratch root,
# default /var/tmp), SLAPO_FRESH_MIN_GB (free disk needed, default 6).
set -euo pipefail

die() { echo "fresh-root: $*" >&2; exit 1; }
now() { date +%s; }
phase_start=0
phase() { phase_name=$1; phase_start=$(now); echo "fresh-root: == $1"; }
phase_end() { echo "fresh-root: $phase_name took $(( $(now) - phase_start )) s"; }

[ "$(id -u)" -eq 0 ] || die "must run as root (debootstrap, mount and chroot need it)"
top=$(git -C "$(dirname "$0")" rev-parse --show-toplevel) || die "not inside a git clone"
base=${SLAPO_FRESH_BASE:-/var/cache/slapo/bookworm-base}
scratch_parent=${SLAPO_FRESH_SCRATCH:-/var/tmp}
min_gb=${SLAPO_FRESH_MIN_GB:-6}
run_steps=${RUN_STEPS:-20}
suite=bookworm

# --- disk: fail early and clearly rather than half-way through an install ---
free_gb() { df -Pk "$1" | awk 'NR == 2 { print int($4 / 1048576) }'; }
mkdir -p "$(dirname "$base")" "$scratch_parent"
for d in "$(dirname "$base")" "$scratch_parent"; do
  f=$(free_gb "$d")
  [ "$f" -ge "$min_gb" ] ||
    die "only ${f} GiB free on the file system of $d; the check needs ${min_gb} GiB (set SLAPO_FRESH_MIN_GB to change)"
done

# --- the host's Debian mirror, read from its apt sources (never hard-coded) ---
host_mirror() {
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk '/^URIs:/ { u = $2 } /^Suites:/ && u != "" && / '"$suite"'( |$)/ { print u; exit }' "$f"
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    awk '$1 == "deb" && $0 ~ " '"$suite"' " { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; exit } }' "$f"
  done
}
mirror=$(host_mirror | head -n 1)
[ -n "$mirror" ] || die "no apt source for Debian $suite found in /etc/apt/sources.list{,.d}; cannot pick a mirror"

# --- the cached base: debootstrap once, check it, rebuild when broken ---
base_ok() {
  [ -f "$base/.slapo-base-ok" ] && [ -x "$base/usr/bin/apt-get" ] && chroot "$base" /bin/true 2>/dev/null
}
if ! base_ok; then
  phase "debootstrap $suite base into $base (from $mirror)"
  command -v debootstrap >/dev/null || {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap ||
      { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap; }
  }
  rm -rf --one-file-system "$base" "$base.tmp"
  debootstrap --variant=minbase "$suite" "$base.tmp" "$mirror" > "$base.log" 2>&1 ||
    { tail -n 20 "$base.log" >&2; rm -rf --one-file-system "$base.tmp"; die "debootstrap failed (log: $base.log)"; }
  touch "$base.tmp/.slapo-base-ok"
  mv "$base.tmp" "$base"
  base_ok || die "the new base at $base does not run /bin/true under chroot"
  phase_end
fi

# --- the scratch root, cleaned up on every exit path ---
root=""
mounts=()
cleanup() {
  local rc=$? i
  trap - EXIT INT TERM HUP
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
    umount "${mounts[i]}" 2>/dev/null || umount -l "${mounts[i]}" 2>/dev/null || true
  done
  if [ -n "$root" ] && [ -d "$root" ]; then
    # Never delete through a mount point left behind (it would reach the host's /dev or /sys).
    if awk -v r="$root" 'index($2, r) == 1 { found = 1 } END { exit !found }' /proc/self/mounts; then
      echo "fresh-root: mounts remain under $root; not deleting it" >&2
      rc=1
    else
      rm -rf --one-file-system "$root"
    fi
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

phase "copy base and clone into a scratch root"
root=$(mktemp -d "$scratch_parent/slapo-fresh-root.XXXXXX")
cp -a "$base/." "$root/"
rm -f "$root/.slapo-base-ok"
mkdir -p "$root/root/slapo"
(cd "$top" && git ls-files -z --cached --others --exclude-standard |
  tar --null -T - -cf - --ignore-failed-read 2>/dev/null) | tar -xf - -C "$root/root/slapo"

# What apt needs to reach its mirrors, and nothing else from the host.
copy_in() { [ -e "$1" ] || return 0; mkdir -p "$root$(dirname "$1")"; cp -L "$1" "$root$1"; }
copy_in /etc/resolv.conf
copy_in /etc/apt/sources.list
for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do copy_in "$f"; done
for f in /etc/apt/apt.conf.d/*; do [ -f "$f" ] && grep -q 'Acquire::' "$f" && copy_in "$f"; done
copy_in /etc/apt/auth.conf
for f in /etc/apt/auth.conf.d/*; do copy_in "$f"; done
for k in $(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '/^Signed-By:/ { print $2 }'); do copy_in "$k"; done
phase_end

for m in proc sys dev dev/shm; do mkdir -p "$root/$m"; done
mount -t proc proc "$root/proc" && mounts+=("$root/proc")
mount --bind /sys "$root/sys" && mounts+=("$root/sys")
mount --bind /dev "$root/dev" && mounts+=("$root/dev")
mount -t tmpfs -o mode=1777 shm "$root/dev/shm" && mounts+=("$root/dev/shm")

in_root() {
  chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 ${http_proxy:+http_proxy=$http_proxy} ${https_proxy:+https_proxy=$https_proxy} \
    ${no_proxy:+no_proxy=$no_proxy} OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    /bin/bash -c "$1"
}

phase "install make (the README's prerequisite)"
in_root 'export DEBIAN_FRONTEND=noninteractive; apt-get update -q >/dev/null &&
  apt-get install -y -q --no-install-recommends make >/dev/null && apt-get clean && rm -rf /var/lib/apt/lists/*'
phase_end

phase "make test (README)"
in_root 'cd /root/slapo && make test' || die "'make test' failed in a fresh Debian $suite root"
phase_end

phase "make run RUN_STEPS=$run_steps (README, shortened)"
in_root "cd /root/slapo && make run RUN_STEPS=$run_steps" || die "'make run' failed in a fresh Debian $suite root"
phase_end
echo "fresh-root: passed: 'make test' and 'make run' work on a fresh Debian $suite root"
