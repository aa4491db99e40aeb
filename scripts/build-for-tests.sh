#!/usr/bin/env bash
# Builds what `make test` needs, or finds it cached: the control plane and the real node, Kueue,
# SeaweedFS, Prometheus, the images and Chromium. Usage: scripts/build-for-tests.sh VENV
#
# The images' build spends much of its time waiting on downloads and compressing on one core, so the
# Go builds of Kueue, SeaweedFS and Prometheus run beside it; what installs Debian packages (cluster.sh,
# the images' build, chromium.sh) never runs beside another that does (apt holds one lock).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$1

bash localcluster/cluster.sh build
{ bash localcluster/kueue.sh build && "$venv/bin/python" localcluster/s3server.py build &&
  bash localcluster/prometheus.sh build; } &
go_builds=$!
images_ok=0
images/build.sh build || images_ok=$?
go_ok=0
wait "$go_builds" || go_ok=$?
[ "$images_ok" -eq 0 ] || { echo "[build] the images' build failed" >&2; exit "$images_ok"; }
[ "$go_ok" -eq 0 ] || { echo "[build] Kueue's, SeaweedFS's or Prometheus's build failed" >&2; exit "$go_ok"; }
scripts/chromium.sh >/dev/null
