#!/usr/bin/env bash
# Kueue (sigs.k8s.io/kueue) on the local control plane of cluster.sh, built from its Go module.
#
# Usage: kueue.sh build|up|down|status
#
# up installs Kueue's CRDs (the module's config/components/crd), starts the controller outside the
# cluster with the admin kubeconfig, and points the CRDs' conversion webhook and Kueue's own admission
# webhooks (for kueue.x-k8s.io objects only: no pod or Job webhook, so nobody else's objects go
# through Kueue) at https://127.0.0.1:$KUEUE_WEBHOOK_PORT, served with a certificate from the
# cluster CA. down removes the webhook configurations and the conversion webhook first, so a stopped
# Kueue blocks nothing, then stops the process. The binary is cached in $DDP_CACHE/bin/kueue-<version>-<patches>.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CLUSTER=$HERE/cluster.sh

# Must match the go.mod of go/kueue.
KUEUE_VERSION=v0.19.2
KUEUE_MODULE=sigs.k8s.io/kueue

DDP_CACHE=${DDP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ddp-operator}
DDP_CLUSTER_DIR=${DDP_CLUSTER_DIR:-$DDP_CACHE/cluster}
# Ports, all on 127.0.0.1, next to cluster.sh's.
WEBHOOK_PORT=${DDP_KUEUE_WEBHOOK_PORT:-20943}
HEALTH_PORT=${DDP_KUEUE_HEALTH_PORT:-20981}
METRICS_PORT=${DDP_KUEUE_METRICS_PORT:-20983}
BIND=127.0.0.1
NAMESPACE=kueue-system
# The kind Kueue is told to leave alone (integrations.externalFrameworks): our operator creates the
# Workloads of DDPJobs itself. MultiKueue's generic adapter dispatches it too (multiKueue.externalFrameworks),
# for a DDPJob with spec.managedBy kueue.x-k8s.io/multikueue on a manager cluster.
EXTERNAL_FRAMEWORK=DDPJob.v1alpha1.ddpoperator.io

export GOTOOLCHAIN=local GOFLAGS=-mod=mod

# Kueue reads its metrics certificate from a fixed in-container path unless internal cert
# management is on (whose certificates name a Service, not 127.0.0.1): go/kueue/*.patch makes it a
# setting, and the cache key changes with the patches.
PATCHES=("$HERE"/go/kueue/*.patch)
BIN_KUEUE=$DDP_CACHE/bin/kueue-$KUEUE_VERSION-$(cat "${PATCHES[@]}" | sha256sum | cut -c1-8)
STATE=$DDP_CLUSTER_DIR/kueue
CERTS=$STATE/certs
PKI=$DDP_CLUSTER_DIR/pki
LOG=$STATE/kueue.log
PIDFILE=$STATE/kueue.pid
WATCHDOG_PIDFILE=$STATE/watchdog.pid
WEBHOOK_CONFIG=ddp-local-kueue
# The CRDs Kueue converts between v1beta2 (stored, what its controllers use) and v1beta1 (deprecated).
CONVERTED_CRDS=(workloads clusterqueues localqueues cohorts multikueueclusters resourceflavors)

exec 3>&2
log() { printf '[kueue] %s\n' "$*" >&3; }
die() { printf '[kueue] error: %s\n' "$*" >&3; exit 1; }

kc() { "$CLUSTER" kubectl "$@"; }

# --- build -----------------------------------------------------------------

# The wrapper module go/kueue, built against a patched copy of the Kueue module (cluster.sh's
# build_patched, as kwok is); the binary is renamed into place only when complete, so an interrupted
# build leaves no half-filled cache entry.
cmd_build() {
  [ -x "$BIN_KUEUE/kueue" ] && return 0
  command -v go >/dev/null || die "go is not installed; Kueue is built from its Go module"
  local started=$SECONDS
  log "building kueue $KUEUE_VERSION (cached afterwards in $BIN_KUEUE; a cold build takes up to 16 min on 2 cores)"
  "$CLUSTER" build-patched kueue "$KUEUE_MODULE" "$BIN_KUEUE" \
    "-X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION" "${PATCHES[@]}"
  log "kueue built in $((SECONDS - started)) s"
}

# --- configuration ---------------------------------------------------------

ca_bundle() { base64 -w0 <"$PKI/ca.crt"; }

make_certs() {
  [ -f "$CERTS/tls.crt" ] && return 0
  mkdir -p "$CERTS"
  "$CLUSTER" sign kueue-webhook "/CN=kueue-webhook" "IP:$BIND,DNS:localhost"
  cp "$PKI/kueue-webhook.crt" "$CERTS/tls.crt"
  cp "$PKI/kueue-webhook.key" "$CERTS/tls.key"
}

write_config() {
  cat >"$STATE/config.yaml" <<EOF
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: $NAMESPACE
health:
  healthProbeBindAddress: $BIND:$HEALTH_PORT
metrics:
  bindAddress: $BIND:$METRICS_PORT
webhook:
  host: $BIND
  port: $WEBHOOK_PORT
  certDir: $CERTS
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
featureGates:
  VisibilityOnDemand: false  # an aggregated API server, which would need a Service in the cluster
integrations:
  frameworks: ["batch/job"]
  externalFrameworks: ["$EXTERNAL_FRAMEWORK"]
multiKueue:
  externalFrameworks:
  - name: $EXTERNAL_FRAMEWORK
EOF
}

# webhook KIND NAME PATH RESOURCES OPERATIONS: one entry of a webhook configuration, pointing at the
# local Kueue. Rules as in the module's config/components/webhook/manifests.yaml (kueue.x-k8s.io only).
webhook() {
  local name=$1 path=$2 resources=$3 operations=$4
  cat <<EOF
- name: $name
  admissionReviewVersions: [v1]
  sideEffects: None
  failurePolicy: Fail
  clientConfig:
    url: https://$BIND:$WEBHOOK_PORT$path
    caBundle: $(ca_bundle)
  rules:
  - apiGroups: [kueue.x-k8s.io]
    apiVersions: [v1beta2]
    operations: $operations
    resources: $resources
EOF
}

webhook_configurations() {
  local m=/mutate-kueue-x-k8s-io-v1beta2 v=/validate-kueue-x-k8s-io-v1beta2
  cat <<EOF
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: $WEBHOOK_CONFIG}
webhooks:
$(webhook mclusterqueue.kb.io "$m-clusterqueue" "[clusterqueues]" "[CREATE]")
$(webhook mresourceflavor.kb.io "$m-resourceflavor" "[resourceflavors]" "[CREATE]")
$(webhook mworkload.kb.io "$m-workload" "[workloads]" "[CREATE]")
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: $WEBHOOK_CONFIG}
webhooks:
$(webhook vclusterqueue.kb.io "$v-clusterqueue" "[clusterqueues]" "[CREATE, UPDATE]")
$(webhook vcohort.kb.io "$v-cohort" "[cohorts]" "[CREATE, UPDATE]")
$(webhook vresourceflavor.kb.io "$v-resourceflavor" "[resourceflavors]" "[CREATE, UPDATE]")
$(webhook vworkload.kb.io "$v-workload" "[workloads, workloads/status]" "[CREATE, UPDATE]")
EOF
}

# conversion STRATEGY: points the converted CRDs at the local Kueue (Webhook) or at nothing (None).
conversion() {
  local patch crd
  if [ "$1" = Webhook ]; then
    patch="{\"spec\":{\"conversion\":{\"strategy\":\"Webhook\",\"webhook\":{\"conversionReviewVersions\":[\"v1\"],\
\"clientConfig\":{\"url\":\"https://$BIND:$WEBHOOK_PORT/convert\",\"caBundle\":\"$(ca_bundle)\"}}}}}"
  else
    patch='{"spec":{"conversion":{"strategy":"None","webhook":null}}}'
  fi
  for crd in "${CONVERTED_CRDS[@]}"; do
    kc get crd "$crd.kueue.x-k8s.io" >/dev/null 2>&1 || continue
    kc patch crd "$crd.kueue.x-k8s.io" --type merge -p "$patch" >/dev/null
  done
}

install_crds() {
  local src
  src=$(cd "$HERE/go/kueue" && go mod download "$KUEUE_MODULE" && go list -m -f '{{.Dir}}' "$KUEUE_MODULE")
  # Server-side: the Workload CRD is too large for the last-applied annotation of a client-side apply.
  kc apply --server-side --force-conflicts -f "$src/config/components/crd/bases" >/dev/null
  kc wait --for condition=Established --timeout 60s -f "$src/config/components/crd/bases" >/dev/null
}

# --- processes -------------------------------------------------------------

alive() { [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

healthy() { curl -sf "http://$BIND:$HEALTH_PORT/readyz" >/dev/null; }

# wait_for WHAT SECONDS COMMAND...: polls COMMAND until it succeeds, failing early if Kueue exited.
wait_for() {
  local what=$1 limit=$2
  shift 2
  local deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    alive || { tail -20 "$LOG" >&3; die "kueue exited while waiting for $what; see $LOG"; }
    [ $SECONDS -lt $deadline ] || die "$what not ready after ${limit}s; see $LOG"
    sleep 0.2
  done
}

converts() { kc get workloads.v1beta1.kueue.x-k8s.io -A --request-timeout 5s; }

cmd_up() {
  "$CLUSTER" status >/dev/null 2>&1 || die "the local cluster is not up (localcluster/cluster.sh up)"
  if alive && healthy; then
    log "already up"
    return 0
  fi
  cmd_down
  cmd_build
  local started=$SECONDS
  mkdir -p "$STATE"
  make_certs
  write_config
  kc get namespace "$NAMESPACE" >/dev/null 2>&1 || kc create namespace "$NAMESPACE" >/dev/null
  install_crds
  log "starting kueue (webhooks on https://$BIND:$WEBHOOK_PORT)"
  KUBECONFIG=$DDP_CLUSTER_DIR/kubeconfig KUEUE_METRICS_CERT_DIR=$CERTS \
    setsid "$BIN_KUEUE/kueue" --config "$STATE/config.yaml" --zap-log-level=2 >"$LOG" 2>&1 </dev/null 3>&- &
  echo $! >"$PIDFILE"
  wait_for "kueue's readiness" 120 healthy
  conversion Webhook
  webhook_configurations | kc apply -f - >/dev/null
  wait_for "the conversion webhook" 60 converts
  log "up in $((SECONDS - started)) s"
  if [ -n "${DDP_KUEUE_OWNER_PID:-}" ]; then watchdog "$DDP_KUEUE_OWNER_PID"; fi
}

# watchdog PID: stops Kueue once PID (a test session that started it) is gone.
watchdog() {
  # shellcheck disable=SC2016  # $1 and $2 are the inner shell's
  setsid bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 1; done; exec "$2" down' \
    watchdog "$1" "$HERE/kueue.sh" >>"$STATE/watchdog.log" 2>&1 </dev/null 3>&- &
  echo $! >"$WATCHDOG_PIDFILE"
}

cmd_down() {
  # Nothing may call a webhook that is going away: the API server is asked first.
  if "$CLUSTER" status >/dev/null 2>&1; then
    kc delete mutatingwebhookconfiguration,validatingwebhookconfiguration "$WEBHOOK_CONFIG" \
      --ignore-not-found >/dev/null 2>&1 || true
    conversion None || true
  fi
  if [ -f "$PIDFILE" ]; then
    local pid
    pid=$(cat "$PIDFILE")
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    rm -f "$PIDFILE"
  fi
  # The watchdog may be the caller; it is stopped last.
  if [ -f "$WATCHDOG_PIDFILE" ] && [ "$(cat "$WATCHDOG_PIDFILE")" != "$PPID" ]; then
    kill -TERM "$(cat "$WATCHDOG_PIDFILE")" 2>/dev/null || true
  fi
  rm -f "$WATCHDOG_PIDFILE"
  log "down"
}

cmd_status() {
  if alive && healthy; then
    echo "kueue running (pid $(cat "$PIDFILE")), webhooks on https://$BIND:$WEBHOOK_PORT"
  else
    echo "kueue stopped"
    return 1
  fi
}

case "${1:-}" in
  build) cmd_build ;;
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  *) echo "usage: $0 build|up|down|status" >&2; exit 2 ;;
esac
