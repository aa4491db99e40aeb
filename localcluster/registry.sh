#!/usr/bin/env bash
# A private image registry for the local cluster's real node: the CNCF distribution registry
# (github.com/distribution/distribution/v3, cmd/registry), built from its Go module, served with TLS
# (a CA of its own) and basic auth (one user, a bcrypt htpasswd entry made by Debian's apache2-utils),
# like the registries shared GPU clusters pull from with image pull secrets.
#
# Usage: registry.sh build|up|down|status|env
#   up      builds the registry once (cached in $DDP_CACHE/bin/registry-<version>), starts it on the node's
#           bridge gateway (the node's address, which only this machine and its pods reach) on a free
#           port, and makes the node's containerd trust its CA (certs.d/<host:port>/, read at each pull)
#   down    stops it, removes the node's certs.d entry, the node's images pulled from it and the
#           instance's folder (the images pushed too)
#   status  whether it runs and answers (401 to an anonymous request)
#   env     the lines a shell evaluates to push to it: REGISTRY, REGISTRY_CA, DOCKER_CONFIG
#
# Settings: DDP_REGISTRY_DIR (the instance's folder: certificates, htpasswd, config, storage, log;
# default $DDP_CLUSTER_DIR/registry; one instance per folder), DDP_REGISTRY_PORT (default 0: a free
# port the kernel picks), DDP_REGISTRY_USER (ddp) and DDP_REGISTRY_PASSWORD (default: random, kept in
# the folder's `password`), DDP_REGISTRY_OWNER_PID (a watchdog runs `down` once that process is gone).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# Must match the go.mod of go/registry.
REGISTRY_VERSION=v3.1.2
REGISTRY_MODULE=github.com/distribution/distribution/v3

DDP_CACHE=${DDP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ddp-operator}
DDP_CLUSTER_DIR=${DDP_CLUSTER_DIR:-$DDP_CACHE/cluster}
# The node's bridge and its gateway address, as cluster.sh sets them up.
BRIDGE=${DDP_BRIDGE:-ddp0}
NODE_SUBNET=${DDP_NODE_SUBNET:-10.244.200.0/24}
GATEWAY=${NODE_SUBNET%.*}.1
# Where the node's containerd reads per-registry settings (node.sh's config_path).
CERTS_D=$DDP_CLUSTER_DIR/node/certs.d
CLUSTER=$HERE/cluster.sh

DIR=${DDP_REGISTRY_DIR:-$DDP_CLUSTER_DIR/registry}
PORT=${DDP_REGISTRY_PORT:-0}
USER_NAME=${DDP_REGISTRY_USER:-ddp}
BIN=$DDP_CACHE/bin/registry-$REGISTRY_VERSION
PIDFILE=$DIR/registry.pid
WATCHDOG_PIDFILE=$DIR/watchdog.pid
LOG=$DIR/registry.log
ADDRESS_FILE=$DIR/address  # host:port, once it listens

export GOTOOLCHAIN=local GOFLAGS=-mod=mod
source "$HERE/gocache.sh"

exec 3>&2
log() { printf '[registry] %s\n' "$*" >&3; }
die() { printf '[registry] error: %s\n' "$*" >&3; exit 1; }

# --- build -------------------------------------------------------------------

cmd_build() {
  [ -x "$BIN/registry" ] && return 0
  command -v go >/dev/null || die "go is not installed; the registry is built from its Go module"
  log "building the distribution registry $REGISTRY_VERSION (cached afterwards in $BIN)"
  go_build_into "$BIN" "$HERE/go/registry" "$REGISTRY_MODULE/cmd/registry" \
    -ldflags "-s -w -X $REGISTRY_MODULE/version.version=$REGISTRY_VERSION" || die "building the registry failed"
  [ -x "$BIN/registry" ] || die "could not build $BIN/registry"
}

# need_htpasswd: Debian's apache2-utils, whose htpasswd -B writes the bcrypt entries the registry reads.
need_htpasswd() {
  command -v htpasswd >/dev/null && return 0
  "$HERE/../scripts/apt-install.sh" apache2-utils 2>&3 || die "could not install apache2-utils (htpasswd)"
}

# --- configuration -----------------------------------------------------------

# make_certs: a CA of this instance's own and the server's certificate for the gateway address.
make_certs() {
  openssl req -x509 -new -newkey rsa:2048 -nodes -keyout "$DIR/ca.key" -out "$DIR/ca.crt" -days 30 \
    -subj "/CN=ddp-operator-local-registry-ca" 2>/dev/null
  openssl req -new -newkey rsa:2048 -nodes -keyout "$DIR/tls.key" -out "$DIR/tls.csr" -subj "/CN=$GATEWAY" 2>/dev/null
  printf 'subjectAltName=IP:%s\nextendedKeyUsage=serverAuth\n' "$GATEWAY" >"$DIR/tls.ext"
  openssl x509 -req -in "$DIR/tls.csr" -CA "$DIR/ca.crt" -CAkey "$DIR/ca.key" -CAcreateserial -days 30 \
    -out "$DIR/tls.crt" -extfile "$DIR/tls.ext" 2>/dev/null
  rm -f "$DIR/tls.csr" "$DIR/tls.ext" "$DIR/ca.srl"
}

# make_htpasswd: the one user, its password from DDP_REGISTRY_PASSWORD or made here (kept in `password`).
make_htpasswd() {
  local password=${DDP_REGISTRY_PASSWORD:-}
  [ -n "$password" ] || password=$(openssl rand -hex 16)
  (umask 077 && printf '%s' "$password" >"$DIR/password")
  htpasswd -B -i -c "$DIR/htpasswd" "$USER_NAME" <"$DIR/password" 2>/dev/null || die "htpasswd failed"
}

write_config() {
  cat >"$DIR/config.yml" <<EOF
version: 0.1
log:
  level: info
  formatter: text
  fields: {service: registry}
storage:
  filesystem: {rootdirectory: $DIR/storage}
  delete: {enabled: true}
  maintenance:
    uploadpurging: {enabled: false}
http:
  addr: $GATEWAY:$PORT
  secret: $(openssl rand -hex 16)
  tls:
    certificate: $DIR/tls.crt
    key: $DIR/tls.key
auth:
  htpasswd:
    realm: ddp-local-registry
    path: $DIR/htpasswd
EOF
}

# write_docker_config: a Docker config.json with the user's credentials in $DIR/docker (what
# `docker login` writes), for DOCKER_CONFIG: buildctl (make images REGISTRY=...) reads it.
write_docker_config() {
  mkdir -p "$DIR/docker"
  (umask 077 && printf '{"auths":{"%s":{"auth":"%s"}}}\n' "$(address)" \
    "$(printf '%s:%s' "$USER_NAME" "$(cat "$DIR/password")" | base64 -w0)" >"$DIR/docker/config.json")
}

# trust: the node's containerd trusts the CA for this registry (hosts.toml next to a copy of the CA).
trust() {
  if [ ! -d "$CERTS_D" ]; then
    log "no $CERTS_D (is the local node up?): the node will not trust this registry"
    return 0
  fi
  local dir
  dir=$CERTS_D/$(address)
  mkdir -p "$dir"
  cp "$DIR/ca.crt" "$dir/ca.crt"
  cat >"$dir/hosts.toml" <<EOF
# Written by localcluster/registry.sh for the registry in $DIR; its down removes it.
server = "https://$(address)"

[host."https://$(address)"]
  capabilities = ["pull", "resolve"]
  ca = "ca.crt"
EOF
  echo "$dir" >"$DIR/certs.d-entry"
}

untrust() {
  [ -f "$DIR/certs.d-entry" ] || return 0
  local dir
  dir=$(cat "$DIR/certs.d-entry")
  # Only an entry this script wrote, inside the node's certs.d.
  case $dir in "$CERTS_D"/*) [ -f "$dir/hosts.toml" ] && grep -q "localcluster/registry.sh" "$dir/hosts.toml" && rm -rf "$dir" ;; esac
  rm -f "$DIR/certs.d-entry"
}

# ctr_node ARGS...: ctr against the node's containerd (namespace k8s.io), quiet about its deprecation notices.
ctr_node() { "$CLUSTER" ctr "$@" 2>/dev/null; }

# config_of TARGET: the config digest of the image manifest TARGET in the node's content store.
config_of() {
  { ctr_node content get "$1" | tr -d ' \n\t' | grep -o '"config":{[^}]*}' | grep -o 'sha256:[0-9a-f]*'; } || true
}

# images_of_node: the node's image names and the digest each names, one "name digest" a line.
images_of_node() { ctr_node images ls | awk 'NR > 1 {print $1, $3}'; }

# named_elsewhere CONFIG PREFIX: a name of the node's for an image whose config is CONFIG, other than an
# image ID (sha256:...) and names under PREFIX; nothing if there is none.
named_elsewhere() {
  local name target
  while read -r name target; do
    case $name in sha256:* | "$2"*) continue ;; esac
    if [ "$(config_of "$target")" = "$1" ]; then echo "$name" && return 0; fi
  done < <(images_of_node)
  return 0
}

# forget_images: removes the node's names for images pulled from this registry: ADDRESS/... (tags and
# digests) and the image-ID names (sha256:<config>) the kubelet's runtime gave them. An image ID that
# another image of the node shares (the same config, imported under another name: the pull pointed it at
# the registry's manifest) is pointed back at that image instead. containerd's garbage collection then
# removes the content no name holds.
forget_images() {
  [ -f "$ADDRESS_FILE" ] && ctr_node version >/dev/null || return 0
  local prefix name target ours=() other
  prefix=$(address)/
  while read -r name target; do
    case $name in "$prefix"*) ;; *) continue ;; esac
    ours+=("$target")
    ctr_node images rm "$name" >/dev/null || log "could not remove the node's image $name"
  done < <(images_of_node)
  [ ${#ours[@]} -gt 0 ] || return 0
  while read -r name target; do
    case $name in sha256:*) ;; *) continue ;; esac
    printf '%s\n' "${ours[@]}" | grep -qxF "$target" || continue
    other=$(named_elsewhere "$name" "$prefix")
    if [ -n "$other" ]; then
      ctr_node images tag --force "$other" "$name" >/dev/null || log "could not point $name back at $other"
    else
      ctr_node images rm "$name" >/dev/null || log "could not remove the node's image $name"
    fi
  done < <(images_of_node)
}

# --- processes ---------------------------------------------------------------

alive() { [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

address() { cat "$ADDRESS_FILE"; }

# answers: the registry's API answers over TLS with its CA, and refuses an anonymous request (401).
answers() {
  [ "$(curl -s -o /dev/null -w '%{http_code}' --cacert "$DIR/ca.crt" "https://$(address)/v2/")" = 401 ]
}

# listening_address: the address the registry logged it listens on (the port the kernel picked).
listening_address() {
  sed -n "s/.*listening on \($GATEWAY:[0-9]*\), tls.*/\1/p" "$LOG" | head -1
}

cmd_up() {
  if alive && answers; then
    log "already up at $(address) ($DIR)"
    return 0
  fi
  ip -4 addr show dev "$BRIDGE" 2>/dev/null | grep -q "inet $GATEWAY/" ||
    die "no $GATEWAY on $BRIDGE: the local node is not up (localcluster/cluster.sh up)"
  cmd_down 2>/dev/null
  cmd_build
  need_htpasswd
  mkdir -p "$DIR/storage"
  make_certs
  make_htpasswd
  write_config
  # Tracing: no exporter (OpenTelemetry's default would send spans to an OTLP collector on localhost).
  OTEL_TRACES_EXPORTER=none setsid "$BIN/registry" serve "$DIR/config.yml" >"$LOG" 2>&1 </dev/null 3>&- &
  echo $! >"$PIDFILE"
  # Should this script's caller die before `down`, the watchdog stops the registry (and cleans up).
  if [ -n "${DDP_REGISTRY_OWNER_PID:-}" ]; then watchdog "$DDP_REGISTRY_OWNER_PID"; fi
  local deadline=$((SECONDS + 30)) found=""
  until [ -n "$found" ]; do
    alive || { tail -5 "$LOG" >&3; die "the registry exited during start; see $LOG"; }
    [ $SECONDS -lt $deadline ] || die "the registry did not listen within 30 s; see $LOG"
    sleep 0.1
    found=$(listening_address)
  done
  echo "$found" >"$ADDRESS_FILE"
  until answers; do
    alive || { tail -5 "$LOG" >&3; die "the registry exited during start; see $LOG"; }
    [ $SECONDS -lt $deadline ] || die "the registry does not answer at https://$found/v2/; see $LOG"
    sleep 0.1
  done
  write_docker_config
  trust
  log "up at https://$found (user $USER_NAME, password in $DIR/password, CA $DIR/ca.crt); push with"
  log "  eval \"\$(localcluster/registry.sh env)\" && make images REGISTRY=\$REGISTRY REGISTRY_CA=\$REGISTRY_CA"
}

# watchdog PID: runs `down` for this instance once PID is gone.
watchdog() {
  # shellcheck disable=SC2016  # $1 and $2 are the inner shell's
  DDP_REGISTRY_DIR=$DIR setsid bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 1; done; exec "$2" down' \
    watchdog "$1" "$HERE/registry.sh" >/dev/null 2>&1 </dev/null 3>&- &
  echo $! >"$WATCHDOG_PIDFILE"
}

cmd_down() {
  [ -d "$DIR" ] || return 0
  if [ -f "$PIDFILE" ]; then
    local pid
    pid=$(cat "$PIDFILE")
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  untrust
  forget_images || log "could not remove all of the node's images from $(address)"
  # The watchdog may be this very process (it execs `down`); otherwise it is stopped last, with its
  # process group (setsid made it the leader; its `sleep` is in it).
  local watchdog
  watchdog=$(cat "$WATCHDOG_PIDFILE" 2>/dev/null || true)
  if [ -n "$watchdog" ] && [ "$watchdog" != $$ ]; then
    kill -TERM -- "-$watchdog" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$watchdog" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -rf "$DIR"
  log "down"
}

cmd_status() {
  if alive && answers; then
    echo "registry running (pid $(cat "$PIDFILE")) at https://$(address), folder $DIR"
  else
    echo "registry stopped ($DIR)"
    return 1
  fi
}

cmd_env() {
  alive || die "the registry is not up ($DIR); localcluster/registry.sh up"
  echo "export REGISTRY=$(address) REGISTRY_CA=$DIR/ca.crt DOCKER_CONFIG=$DIR/docker"
}

case "${1:-}" in
  build) cmd_build ;;
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  env) cmd_env ;;
  *) echo "usage: $0 build|up|down|status|env" >&2; exit 2 ;;
esac
