#!/usr/bin/env bash
# Prints the path of a virtual environment holding requirements/test.txt, creating it on first use.
# It lives outside the clone, keyed by the Python version and the requirements' hash, so every
# clone on this machine (CI's too) shares it. The marker file is written last: an interrupted
# install is redone from scratch.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-python3}
cache=${DDP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ddp-operator}
key=$("$python" -c 'import sys; print("py%d.%d" % sys.version_info[:2])')-$(sha256sum "$root/requirements/test.txt" | cut -c1-12)
venv=$cache/venv/$key
if [ ! -f "$venv/.complete" ]; then
  echo "[venv] creating $venv (first time only)" >&2
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$root/requirements/test.txt" >&2
  touch "$venv/.complete"
fi
echo "$venv"
