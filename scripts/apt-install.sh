#!/usr/bin/env bash
# Installs the Debian packages named that are missing, without recommends, one apt-get at a time on
# the machine: the builds that install packages (the node's, the images', Chromium for the tests, the
# registry's htpasswd) run beside each other, and apt holds one lock that a second apt-get would fail
# on instead of waiting. apt's output is shown only when it fails. Usage: scripts/apt-install.sh PACKAGE...
set -euo pipefail
missing=()
for pkg in "$@"; do
  dpkg-query -W -f '${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
fail() { echo "[apt] $*" >&2; exit 1; }
command -v apt-get >/dev/null || fail "missing Debian packages ${missing[*]}, and there is no apt-get to install them"
[ "$(id -u)" -eq 0 ] || fail "needs the Debian packages ${missing[*]}; install them (as root: apt-get install ${missing[*]}) and rerun"
export DEBIAN_FRONTEND=noninteractive
exec 9>/run/lock/ddp-operator-apt.lock
flock 9
echo "[apt] installing ${missing[*]}" >&2
log=$(mktemp)
trap 'rm -f "$log"' EXIT
install() { apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$log" 2>&1; }
install || { apt-get update -q >>"$log" 2>&1 && install; } ||
  { tail -n 20 "$log" >&2; fail "apt-get could not install ${missing[*]} (its last words above)"; }
