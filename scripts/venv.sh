#!/usr/bin/env bash
# Prints the path of a virtual environment holding requirements/test.txt, creating it on first use.
# It lives outside the clone, keyed by the Python version and the requirements' hash, so every
# clone on this machine (CI's too) shares it. The marker file is written last: an interrupted
# install is redone from scratch. One creation at a time: a second caller waits for the first's.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-python3}
cache=${DDP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ddp-operator}
key=$("$python" -c 'import sys; print("py%d.%d" % sys.version_info[:2])')-$(sha256sum "$root/requirements/test.txt" | cut -c1-12)
venv=$cache/venv/$key
if [ ! -f "$venv/.complete" ]; then
  mkdir -p "$cache/venv"
  exec 9>"$cache/venv/.$key.lock"
  flock 9
fi
if [ ! -f "$venv/.complete" ]; then
  started=$SECONDS
  echo "[venv] creating $venv (first time only; about 3 min: torch is large)" >&2
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$root/requirements/test.txt" >&2
  touch "$venv/.complete"
  echo "[venv] created in $((SECONDS - started)) s" >&2
fi
exec 9>&-
# `kubectl ddp` (the client's console script) on the venv's PATH, running this clone's client. The
# venv is shared, so the launcher is written again on every call (atomically, by rename): it runs
# the code of the clone that called this script last. `pip install ".[client]"` installs the same.
launcher=$(mktemp "$venv/bin/.kubectl-ddp.XXXXXX")
printf '#!/bin/sh\n# kubectl ddp, written by %s/scripts/venv.sh\nPYTHONPATH="%s/client:%s/contract${PYTHONPATH:+:$PYTHONPATH}" exec "%s/bin/python" -m ddp_client "$@"\n' \
  "$root" "$root" "$root" "$venv" > "$launcher"
chmod 755 "$launcher"
mv -f "$launcher" "$venv/bin/kubectl-ddp"
echo "$venv"
