#!/usr/bin/env bash
# Prometheus for the tests that evaluate the chart's Grafana dashboard (tests/chart/test_dashboard_on_prometheus.py):
# cmd/prometheus of github.com/prometheus/prometheus, built from its Go module through the wrapper module
# go/prometheus with Kubernetes service discovery only (Prometheus's own remove_all_sd and enable_kubernetes_sd
# build tags leave out the other 25 mechanisms and the cloud providers' SDKs they bring) and no web UI assets
# (the tests use the HTTP API). The tests start and stop it themselves (tests/prometheus.py).
#
# Usage: prometheus.sh build|bin
#   build   builds it once (cached in $DDP_CACHE/bin/prometheus-<version>-k8s-sd)
#   bin     prints the binary's path, building it first if needed
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# Must match the go.mod of go/prometheus: the Go module's v0.316.0 is Prometheus 3.16.0.
PROMETHEUS_VERSION=v3.16.0
PROMETHEUS_MODULE=github.com/prometheus/prometheus
BUILD_TAGS=remove_all_sd,enable_kubernetes_sd

DDP_CACHE=${DDP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ddp-operator}
BIN=$DDP_CACHE/bin/prometheus-$PROMETHEUS_VERSION-k8s-sd

export GOTOOLCHAIN=local GOFLAGS=-mod=mod
source "$HERE/gocache.sh"

exec 3>&2
log() { printf '[prometheus] %s\n' "$*" >&3; }
die() { printf '[prometheus] error: %s\n' "$*" >&3; exit 1; }

cmd_build() {
  [ -x "$BIN/prometheus" ] && return 0
  command -v go >/dev/null || die "go is not installed; Prometheus is built from its Go module"
  log "building Prometheus $PROMETHEUS_VERSION (cached afterwards in $BIN; a cold build takes 7 min of CPU, 12 min on 2 cores beside the other builds)"
  go_build_into "$BIN" "$HERE/go/prometheus" "$PROMETHEUS_MODULE/cmd/prometheus" -tags "$BUILD_TAGS" \
    -ldflags "-s -w -X github.com/prometheus/common/version.Version=${PROMETHEUS_VERSION#v}" || die "building Prometheus failed"
  [ -x "$BIN/prometheus" ] || die "could not build $BIN/prometheus"
}

case ${1:-} in
  build) cmd_build ;;
  bin) cmd_build && echo "$BIN/prometheus" ;;
  *) echo "usage: $0 build|bin" >&2; exit 2 ;;
esac
