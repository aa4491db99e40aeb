#!/usr/bin/env bash
# crds/ is the single source of the API; the chart carries a copy in charts/crds/.
# Usage: scripts/sync-crds.sh          copy crds/*.yaml into the chart
#        scripts/sync-crds.sh --check  fail, naming the file, when the chart's copy differs
set -euo pipefail
shopt -s nullglob  # an empty directory is an empty list, not a literal "*.yaml"
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
src=$root/crds
dst=$root/charts/crds
if [ "${1:-}" = "--check" ]; then
  status=0
  for f in "$src"/*.yaml; do
    name=$(basename "$f")
    if [ ! -e "$dst/$name" ]; then
      echo "charts/crds/$name is missing: run scripts/sync-crds.sh" >&2
      status=1
    elif ! cmp -s "$f" "$dst/$name"; then
      echo "charts/crds/$name differs from crds/$name: run scripts/sync-crds.sh" >&2
      status=1
    fi
  done
  for f in "$dst"/*.yaml; do
    [ -e "$src/$(basename "$f")" ] || { echo "charts/crds/$(basename "$f") has no source in crds/" >&2; status=1; }
  done
  exit $status
fi
mkdir -p "$dst"
rm -f "$dst"/*.yaml
cp "$src"/*.yaml "$dst"/
