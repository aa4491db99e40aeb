#!/usr/bin/env bash
# Builds what `make test` needs, or finds it cached: the control plane and the real node, Kueue,
# SeaweedFS, Prometheus, the images (the frameworks image derived from the trainer's too), the test
# registry and Chromium. Usage: scripts/build-for-tests.sh [VENV]
# (SeaweedFS's build runs with VENV's python, else python3.)
#
# The images' build spends much of its time waiting on downloads and compressing on one core, so it
# runs beside the Go builds of the control plane and the node, and Chromium's install beside both;
# Kueue's, SeaweedFS's and Prometheus's Go builds follow the control plane's. The builds that install
# Debian packages take turns at apt (scripts/apt-install.sh), and the runc both the node and the
# images use is built once (built_once in localcluster/gocache.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:+$1/bin/python}

# The images, then the image the framework tests build FROM the trainer (examples/frameworks) and the
# test registry's binary, all waiting more than computing, beside the control plane's compile.
{ images/build.sh build && images/build.sh derived frameworks examples/frameworks >/dev/null &&
  bash localcluster/registry.sh build; } &
images=$!
scripts/chromium.sh >/dev/null &
chromium=$!
go_ok=0
{ bash localcluster/cluster.sh build && bash localcluster/kueue.sh build &&
  "${python:-python3}" localcluster/s3server.py build && bash localcluster/prometheus.sh build; } || go_ok=$?
images_ok=0
wait "$images" || images_ok=$?
chromium_ok=0
wait "$chromium" || chromium_ok=$?
[ "$go_ok" -eq 0 ] || { echo "[build] the cluster's, Kueue's, SeaweedFS's or Prometheus's build failed" >&2; exit "$go_ok"; }
[ "$images_ok" -eq 0 ] || { echo "[build] the images' or the registry's build failed" >&2; exit "$images_ok"; }
[ "$chromium_ok" -eq 0 ] || { echo "[build] Chromium's install failed" >&2; exit "$chromium_ok"; }
