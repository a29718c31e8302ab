#!/bin/sh
# Installs the Debian packages given as arguments when any is missing.
# Used by `make test` / `make run` so that both work on a fresh Debian 12 machine.
set -e
missing=""
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "slapo: installing Debian packages:$missing"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
# -qq and no pty for dpkg: one line per package instead of apt's and
# dpkg's progress counters run together on one line in a log.
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq -o Dpkg::Use-Pty=0 --no-install-recommends $missing
echo "slapo: installed:$missing"
