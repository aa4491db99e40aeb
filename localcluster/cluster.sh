#!/usr/bin/env bash
# A real, local Kubernetes control plane built from upstream Go modules:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kwok and helm.
# kwok plays the kubelet for fake GPU nodes (tainted), so pods go through the real scheduler.
# Beside them one real node (node.sh): kubelet, containerd, runc, CNI bridge, CoreDNS.
#
# Usage: cluster.sh build|up|down|status|env|version|releases|kubectl ARGS...|helm ARGS...|ctr ARGS...|image-import ROOTFS REF [CONFIG]
#   ctr ARGS: ctr against the real node's containerd ($DDP_CLUSTER_DIR/node/containerd.sock), namespace
#   k8s.io, e.g. `cluster.sh ctr images import image.tar`; image-import: an image made from a folder.
#
# Everything listens on 127.0.0.1, except the real node's kubelet and DNS, on its bridge's gateway.
# Builds are cached outside the git tree under $DDP_CACHE/bin/<component>-<version>, containerd's
# images under $DDP_CACHE/containerd-<version>; cluster state lives in $DDP_CLUSTER_DIR.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# Pinned versions; each must match the go.mod of its wrapper module under go/.
# Kubernetes: the releases the cluster can run, each built from go/kubernetes-<minor>. DDP_K8S_VERSION
# picks one by its minor (1.30) or in full (v1.30.14); the full test suite runs on the default.
K8S_RELEASES=(v1.30.14 v1.34.4 v1.37.2)
K8S_DEFAULT=v1.37.2
ETCD_VERSION=v3.6.16
KWOK_VERSION=v0.7.0
HELM_VERSION=v3.19.0
# The real node: kubelet (K8S_VERSION), containerd, runc, CNI plugins, CoreDNS, the pause image.
CONTAINERD_VERSION=v2.4.2
RUNC_VERSION=v1.5.2
CNI_PLUGINS_VERSION=v1.9.1
COREDNS_VERSION=v1.15.0
PAUSE_VERSION=3.10.1

exec 3>&2  # messages go here even from inside checks whose own output is silenced
log() { printf '[cluster] %s\n' "$*" >&3; }
die() { printf '[cluster] error: %s\n' "$*" >&3; exit 1; }

# k8s_release WANTED: the release of K8S_RELEASES that WANTED (1.30, v1.30 or v1.30.14) names.
k8s_release() {
  local wanted=${1#v} release
  for release in "${K8S_RELEASES[@]}"; do
    if [ "$wanted" = "${release#v}" ] || [ "$wanted" = "$(cut -d. -f1,2 <<<"${release#v}")" ]; then
      echo "$release"
      return 0
    fi
  done
  die "DDP_K8S_VERSION=$1 is not a Kubernetes release this cluster builds; pick one of ${K8S_RELEASES[*]} (or its minor, e.g. 1.30)"
}
DDP_CACHE=${DDP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ddp-operator}
DDP_CLUSTER_DIR=${DDP_CLUSTER_DIR:-$DDP_CACHE/cluster}
# Node pool advertised by kwok; 0 neither builds nor starts kwok (the demo runs on the real node only).
DDP_NODES=${DDP_NODES:-4}
DDP_GPUS_PER_NODE=${DDP_GPUS_PER_NODE:-8}
# Ports, all on 127.0.0.1. Uncommon defaults so a real cluster on the same machine is left alone.
API_PORT=${DDP_API_PORT:-16443}
ETCD_PORT=${DDP_ETCD_PORT:-12379}
ETCD_PEER_PORT=${DDP_ETCD_PEER_PORT:-12380}
KCM_PORT=${DDP_KCM_PORT:-20257}
SCHED_PORT=${DDP_SCHED_PORT:-20259}
KWOK_PORT=${DDP_KWOK_PORT:-20247}
BIND=127.0.0.1
# The real node (a kubelet with containerd, next to kwok's fake nodes); DDP_REAL_NODE=0 leaves it out.
DDP_REAL_NODE=${DDP_REAL_NODE:-1}
PAUSE_IMAGE=registry.k8s.io/pause:$PAUSE_VERSION
NODE_NAME=${DDP_NODE_NAME:-local-node}
# The pod bridge: a private /24 inside the cluster's pod CIDR, apart from the fake IPs kwok hands out
# (KWOK_CIDR). The kubelet, its node IP and CoreDNS sit on the gateway; pods get the rest.
BRIDGE=${DDP_BRIDGE:-ddp0}
NODE_SUBNET=${DDP_NODE_SUBNET:-10.244.200.0/24}
NODE_GATEWAY=${NODE_SUBNET%.*}.1
KUBELET_PORT=${DDP_KUBELET_PORT:-20250}             # on the gateway: the API server's logs/exec go here
KUBELET_HEALTHZ_PORT=${DDP_KUBELET_HEALTHZ_PORT:-20248}  # on 127.0.0.1
DNS_HEALTH_PORT=${DDP_DNS_HEALTH_PORT:-20253}        # on 127.0.0.1; DNS itself is on the gateway, port 53
# containerd's root (content store, images, snapshots) outlives the cluster, so imported images stay.
CONTAINERD_ROOT=${DDP_CONTAINERD_ROOT:-$DDP_CACHE/containerd-$CONTAINERD_VERSION}
# The kubernetes Service's address (first of SERVICE_CIDR): DNAT'ed to the API server for pods.
KUBERNETES_SERVICE_IP=10.96.0.1
KWOK_CIDR=10.244.0.1/17
SERVICE_CIDR=10.96.0.0/16
POD_CIDR=10.244.0.0/16

export GOTOOLCHAIN=local GOFLAGS=-mod=mod
source "$HERE/gocache.sh"

# use_release RELEASE: K8S_VERSION and what follows from it (its minor, wrapper module and binaries).
use_release() {
  K8S_VERSION=$1
  K8S_MINOR=${K8S_VERSION#v1.}
  K8S_MINOR=${K8S_MINOR%%.*}
  K8S_MODULE=kubernetes-1.$K8S_MINOR
  BIN_K8S=$DDP_CACHE/bin/kubernetes-$K8S_VERSION
  BIN_KUBELET=$DDP_CACHE/bin/kubelet-$K8S_VERSION
}
picked=$(k8s_release "${DDP_K8S_VERSION:-$K8S_DEFAULT}")  # an assignment, so that its refusal stops the script
use_release "$picked"
BIN_ETCD=$DDP_CACHE/bin/etcd-$ETCD_VERSION
# kwok carries our patches (go/kwok/*.patch; the key changes with them): see build_kwok.
KWOK_PATCHES=("$HERE"/go/kwok/*.patch)
BIN_KWOK=$DDP_CACHE/bin/kwok-$KWOK_VERSION-$(cat "${KWOK_PATCHES[@]}" | sha256sum | cut -c1-8)
# The Kubernetes release `helm template` and `helm lint` assume without a cluster (what a chart's kubeVersion
# is checked against): the client-go helm is built with, set as helm's own Makefile does (else 1.20).
HELM_KUBE_MINOR=$(awk '$1 == "k8s.io/client-go" {split($2, v, "."); print v[2]}' "$HERE/go/helm/go.mod")
BIN_HELM=$DDP_CACHE/bin/helm-$HELM_VERSION-kube1.$HELM_KUBE_MINOR
BIN_CONTAINERD=$DDP_CACHE/bin/containerd-$CONTAINERD_VERSION
BIN_RUNC=$DDP_CACHE/bin/runc-$RUNC_VERSION
BIN_CNI=$DDP_CACHE/bin/cni-plugins-$CNI_PLUGINS_VERSION
BIN_COREDNS=$DDP_CACHE/bin/coredns-$COREDNS_VERSION
BIN_PAUSE=$DDP_CACHE/bin/pause-$PAUSE_VERSION
PKI=$DDP_CLUSTER_DIR/pki
LOGS=$DDP_CLUSTER_DIR/logs
PIDS=$DDP_CLUSTER_DIR/pids
KUBECONFIG_FILE=$DDP_CLUSTER_DIR/kubeconfig
NODE_DIR=$DDP_CLUSTER_DIR/node
CONTAINERD_SOCKET=$NODE_DIR/containerd.sock
# The cgroup (in every hierarchy) under which the kubelet puts its pods.
NODE_CGROUP=ddp.$BRIDGE
# One nftables table per bridge holds this node's rules; down deletes it whole.
NFT_TABLE=ddp_${BRIDGE//[^a-zA-Z0-9_]/_}
# The CNI network's name, which names libcni's cache of each pod's result (in a fixed folder).
CNI_NETWORK=ddp-$BRIDGE
CNI_RESULTS=/var/lib/cni/results
CONTROL_PLANE=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)
NODE_COMPONENTS=(containerd coredns kubelet)
COMPONENTS=("${CONTROL_PLANE[@]}")

node_enabled() { [ "$DDP_REAL_NODE" = 1 ]; }
fake_nodes_enabled() { [ "$DDP_NODES" -gt 0 ]; }
if node_enabled; then COMPONENTS+=("${NODE_COMPONENTS[@]}"); fi

# --- build -----------------------------------------------------------------

# go_build MODULE OUT_DIR LDFLAGS PKG...: builds the wrapper module go/MODULE (or the module in the
# folder MODULE, if it is a path) into a temporary folder, then renames it into place, so an
# interrupted build never leaves a half-filled cache entry.
go_build() {
  local mod=$1 out=$2 ldflags=$3
  shift 3
  [ -d "$out" ] && return 0
  case $mod in /*) ;; *) mod=$HERE/go/$mod ;; esac
  local tmp="$out.tmp.$$"
  rm -rf "$tmp" && mkdir -p "$tmp"
  (cd "$mod" && go build -trimpath -ldflags "-s -w $ldflags" -o "$tmp/" "$@")
  mv "$tmp" "$out"
}

# kwok plays the kubelet, and must delete a pod the way the kubelet does: with the pod's uid as a
# precondition. Upstream kwok deletes by name, so a deletion it queued for a pod can land on the
# next pod of that name (a gang restart recreates every rank under its old name within a second),
# and the next, which made gang restarts of 64+ ranks thrash for minutes. The wrapper module is
# built against a patched copy of the kwok module (go/kwok/*.patch).
build_kwok() {
  build_patched kwok sigs.k8s.io/kwok "$BIN_KWOK" "-X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION" \
    "${KWOK_PATCHES[@]}"
}

# build_patched NAME MODULE OUT LDFLAGS PATCH...: MODULE's cmd/NAME, built into OUT through the wrapper
# module go/NAME against a copy of MODULE (the version go/NAME/go.mod pins) with the patches applied.
build_patched() {
  local name=$1 module=$2 out=$3 ldflags=$4 work src p
  shift 4
  [ -d "$out" ] && return 0
  work="$out.src.$$"
  rm -rf "$work" && mkdir -p "$work"
  src=$(cd "$HERE/go/$name" && go mod download "$module" && go list -m -f '{{.Dir}}' "$module")
  cp -r "$src" "$work/$name" && chmod -R u+w "$work/$name"
  for p in "$@"; do
    patch -s -d "$work/$name" -p1 <"$p" || die "$p does not apply to $module"
  done
  cp "$HERE/go/$name/go.mod" "$HERE/go/$name/go.sum" "$work/"
  (cd "$work" && go mod edit -replace "$module=$work/$name")
  go_build "$work" "$out" "$ldflags" "$module/cmd/$name"
  rm -rf "$work"
}

# apt_install PACKAGE...: installs the Debian packages the node needs that are missing.
apt_install() {
  "$HERE/../scripts/apt-install.sh" "$@" 2>&3 || die "could not install the Debian packages $*"
}

# oci_image ROOTFS REF CONFIG OUT: writes a one-layer OCI image layout tarball of the folder ROOTFS,
# named REF (what `ctr images import` tags it as), with CONFIG as its image config (JSON:
# Entrypoint, Cmd, User, Env...). Reproducible: the same folder gives the same digests.
oci_image() {
  local rootfs=$1 ref=$2 config=$3 out=$4
  local dir
  dir=$(mktemp -d)
  mkdir -p "$dir/blobs/sha256"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$rootfs" -cf "$dir/layer" .
  local layer layer_size
  layer=$(sha256sum "$dir/layer" | cut -d' ' -f1)
  layer_size=$(stat -c %s "$dir/layer")
  mv "$dir/layer" "$dir/blobs/sha256/$layer"
  # blob JSON: stores JSON as a blob and prints "digest size".
  blob() {
    local digest
    printf '%s' "$1" >"$dir/blob"
    digest=$(sha256sum "$dir/blob" | cut -d' ' -f1)
    mv "$dir/blob" "$dir/blobs/sha256/$digest"
    echo "$digest $(stat -c %s "$dir/blobs/sha256/$digest")"
  }
  local cfg manifest
  read -r -a cfg < <(blob '{"architecture":"amd64","os":"linux","config":'"$config"',"rootfs":{"type":"layers","diff_ids":["sha256:'"$layer"'"]}}')
  read -r -a manifest < <(blob '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:'"${cfg[0]}"'","size":'"${cfg[1]}"'},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:'"$layer"'","size":'"$layer_size"'}]}')
  printf '{"imageLayoutVersion":"1.0.0"}' >"$dir/oci-layout"
  printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
    "${manifest[0]}" "${manifest[1]}" "$ref" "${ref##*:}" >"$dir/index.json"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$dir" -cf "$out" oci-layout index.json blobs
  rm -rf "$dir"
}

# build_pause: the sandbox ("pause") container's binary, compiled statically from the Kubernetes
# module's build/pause/linux/pause.c, as an OCI image layout tarball (pause.tar) to import.
build_pause() {
  [ -d "$BIN_PAUSE" ] && return 0
  local src tmp="$BIN_PAUSE.tmp.$$"
  src=$(cd "$HERE/go/$K8S_MODULE" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c
  [ -f "$src" ] || die "$src not found in the Kubernetes module"
  rm -rf "$tmp" && mkdir -p "$tmp/rootfs"
  gcc -Os -Wall -Werror -static -DVERSION="v$PAUSE_VERSION-ddp" -o "$tmp/rootfs/pause" "$src"
  oci_image "$tmp/rootfs" "$PAUSE_IMAGE" '{"Entrypoint":["/pause"],"User":"65535:65535"}' "$tmp/pause.tar"
  rm -rf "$tmp/rootfs"
  mv "$tmp" "$BIN_PAUSE"
}

# build_node: the real node's binaries (kubelet, containerd, runc, CNI plugins, CoreDNS, pause).
build_node() {
  local kv=$1
  # busybox-static: the tests' pod image (tests/localcluster/test_real_node.py).
  apt_install libseccomp-dev nftables gcc libc6-dev busybox-static
  step kubelet "$BIN_KUBELET" go_build "$K8S_MODULE" "$BIN_KUBELET" "$kv" k8s.io/kubernetes/cmd/kubelet
  local cv="-X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION"
  CGO_ENABLED=0 step containerd "$BIN_CONTAINERD" go_build containerd "$BIN_CONTAINERD" "$cv" \
    github.com/containerd/containerd/v2/cmd/containerd \
    github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 github.com/containerd/containerd/v2/cmd/ctr
  # runc needs cgo (its nsenter) and libseccomp: without seccomp every sandbox fails on the default profile.
  CGO_ENABLED=1 GOFLAGS="$GOFLAGS -tags=seccomp" \
    step runc "$BIN_RUNC" go_build runc "$BIN_RUNC" "-X main.version=${RUNC_VERSION#v}" github.com/opencontainers/runc
  CGO_ENABLED=0 step "CNI plugins" "$BIN_CNI" go_build cni "$BIN_CNI" "" \
    github.com/containernetworking/plugins/plugins/main/bridge github.com/containernetworking/plugins/plugins/ipam/host-local \
    github.com/containernetworking/plugins/plugins/main/loopback github.com/containernetworking/plugins/plugins/meta/portmap
  CGO_ENABLED=0 step coredns "$BIN_COREDNS" go_build coredns "$BIN_COREDNS" "" .
  step pause "$BIN_PAUSE" build_pause
}

# The build's progress: `step` says each component it builds as "(n/m) NAME", where m counts the
# components not cached yet (set by cmd_build), at its start and with the seconds it took.
STEP_DONE=0
STEP_TOTAL=0

# step NAME OUT COMMAND...: runs COMMAND to build NAME into OUT, unless OUT is there (cached).
step() {
  local name=$1 out=$2 started=$SECONDS
  shift 2
  [ -d "$out" ] && return 0
  STEP_DONE=$((STEP_DONE + 1))
  log "($STEP_DONE/$STEP_TOTAL) $name: building (cached afterwards in $out)"
  built_once "$out" "$@"
  log "($STEP_DONE/$STEP_TOTAL) $name: built in $((SECONDS - started)) s"
}

cmd_build() {
  command -v go >/dev/null || die "go is not installed; the control plane is built from Go modules"
  local started=$SECONDS
  local kv="-X k8s.io/component-base/version.gitVersion=$K8S_VERSION"
  kv+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$K8S_MINOR"
  kv+=" -X k8s.io/component-base/version.gitTreeState=clean"
  kv+=" -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
  kv+=" -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$K8S_MINOR"
  local outs=("$BIN_ETCD" "$BIN_K8S" "$BIN_HELM") out
  if fake_nodes_enabled; then outs+=("$BIN_KWOK"); fi
  if node_enabled; then outs+=("$BIN_KUBELET" "$BIN_CONTAINERD" "$BIN_RUNC" "$BIN_CNI" "$BIN_COREDNS" "$BIN_PAUSE"); fi
  for out in "${outs[@]}"; do [ -d "$out" ] || STEP_TOTAL=$((STEP_TOTAL + 1)); done
  if [ "$STEP_TOTAL" -gt 0 ]; then
    log "building $STEP_TOTAL of ${#outs[@]} components (a cold build takes 10 to 25 min on 2 cores)"
    go_cache_scope build_components "$kv"
  fi
  log "binaries ready in $((SECONDS - started)) s"
}

# build_components KV: the components not cached yet, one Go build cache shared by all (the kubelet
# and the control plane share most of Kubernetes' packages).
build_components() {
  local kv=$1
  step etcd "$BIN_ETCD" go_build etcd "$BIN_ETCD" "" .
  step "kube-apiserver, kube-controller-manager, kube-scheduler, kubectl" "$BIN_K8S" go_build "$K8S_MODULE" "$BIN_K8S" "$kv" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
  if fake_nodes_enabled; then step kwok "$BIN_KWOK" build_kwok; fi
  local hv="-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" pkg
  for pkg in chartutil lint/rules; do
    hv+=" -X helm.sh/helm/v3/pkg/$pkg.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/$pkg.k8sVersionMinor=$HELM_KUBE_MINOR"
  done
  step helm "$BIN_HELM" go_build helm "$BIN_HELM" "$hv" helm.sh/helm/v3/cmd/helm
  if node_enabled; then build_node "$kv"; fi
}

# --- certificates ----------------------------------------------------------

# sign NAME SUBJECT [SAN]: a key and a certificate signed by the cluster CA.
sign() {
  local name=$1 subj=$2 san=${3:-}
  openssl req -new -newkey rsa:2048 -nodes -keyout "$PKI/$name.key" -out "$PKI/$name.csr" -subj "$subj" 2>/dev/null
  local ext="$PKI/$name.ext"
  if [ -n "$san" ]; then
    printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$san" >"$ext"
  else
    printf 'extendedKeyUsage=clientAuth\n' >"$ext"
  fi
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
    -days 3650 -out "$PKI/$name.crt" -extfile "$ext" 2>/dev/null
}

make_pki() {
  [ -f "$PKI/admin.crt" ] && return 0
  mkdir -p "$PKI"
  openssl req -x509 -new -newkey rsa:2048 -nodes -keyout "$PKI/ca.key" -out "$PKI/ca.crt" \
    -days 3650 -subj "/CN=ddp-operator-local-ca" 2>/dev/null
  # Pods reach the API server at the kubernetes Service's address (see node_network).
  sign apiserver "/CN=kube-apiserver" "IP:127.0.0.1,IP:$KUBERNETES_SERVICE_IP,IP:$NODE_GATEWAY,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  sign admin "/O=system:masters/CN=kubernetes-admin"
  sign controller-manager "/CN=system:kube-controller-manager"
  sign scheduler "/CN=system:kube-scheduler"
  sign kwok "/O=system:masters/CN=kwok"
  # The real node: the kubelet's own identity, its serving certificate, the API server's client
  # certificate for logs/exec (bound to system:kubelet-api-admin) and CoreDNS's (see node_rbac).
  sign node "/O=system:nodes/CN=system:node:$NODE_NAME"
  sign kubelet-serving "/CN=$NODE_NAME" "IP:$NODE_GATEWAY,DNS:$NODE_NAME"
  sign apiserver-kubelet-client "/CN=kube-apiserver-kubelet-client"
  sign coredns "/CN=ddp:coredns"
  openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
  openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
}

# kubeconfig NAME: a kubeconfig that authenticates with the client certificate NAME.
write_kubeconfig() {
  local name=$1 file=$2
  cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: ddp-local
  cluster:
    server: https://$BIND:$API_PORT
    certificate-authority: $PKI/ca.crt
users:
- name: $name
  user:
    client-certificate: $PKI/$name.crt
    client-key: $PKI/$name.key
contexts:
- name: ddp-local
  context: {cluster: ddp-local, user: $name}
current-context: ddp-local
EOF
}

# --- processes -------------------------------------------------------------

start() {
  local name=$1
  shift
  log "starting $name"
  setsid "$@" >"$LOGS/$name.log" 2>&1 </dev/null 3>&- &
  echo $! >"$PIDS/$name.pid"
}

alive() { [ -f "$PIDS/$1.pid" ] && kill -0 "$(cat "$PIDS/$1.pid")" 2>/dev/null; }

# started_and NAME COMMAND...: fails at once (with NAME's log) if NAME's process has exited.
started_and() {
  local name=$1
  shift
  if ! alive "$name"; then
    tail -5 "$LOGS/$name.log" >&3
    die "$name exited during start; see $LOGS/$name.log"
  fi
  "$@"
}

# wait_for WHAT SECONDS COMMAND...: polls COMMAND until it succeeds.
wait_for() {
  local what=$1 limit=$2
  shift 2
  local deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then
      die "$what not ready after ${limit}s; see $LOGS"
    fi
    sleep 0.2
  done
}

api_healthy() {
  curl -sf --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
    "https://$BIND:$API_PORT/readyz" >/dev/null
}

kc() { "$BIN_K8S/kubectl" --kubeconfig "$KUBECONFIG_FILE" "$@"; }

fake_nodes() {
  local i
  for ((i = 0; i < DDP_NODES; i++)); do
    cat <<EOF
---
apiVersion: v1
kind: Node
metadata:
  name: gpu-node-$i
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    kubernetes.io/hostname: gpu-node-$i
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    type: kwok
    nvidia.com/gpu.present: "true"
spec:
  # Only pods that tolerate fake nodes land here: kwok fakes Running for any image. The real node
  # takes ordinary pods.
  taints:
  - {key: kwok.x-k8s.io/node, value: fake, effect: NoSchedule}
status:
  capacity: {cpu: "64", memory: 512Gi, pods: "256", nvidia.com/gpu: "$DDP_GPUS_PER_NODE"}
  allocatable: {cpu: "64", memory: 512Gi, pods: "256", nvidia.com/gpu: "$DDP_GPUS_PER_NODE"}
EOF
  done
}

# running_version: the Kubernetes release of the cluster in $DDP_CLUSTER_DIR ('' if none was started).
running_version() { cat "$DDP_CLUSTER_DIR/k8s-version" 2>/dev/null || true; }

# use_running_version: the binaries of the cluster that is up, whatever DDP_K8S_VERSION says now.
use_running_version() {
  local running
  running=$(running_version)
  [ -n "$running" ] && [ "$running" != "$K8S_VERSION" ] || return 0
  use_release "$running"
}

# controllers: the controller manager's, less node IPAM (kwok's nodes have fake addresses) and the cloud
# node lifecycle (no cloud; 1.37 has no such controller).
controllers() {
  if [ "$K8S_MINOR" -lt 37 ]; then echo '*,-nodeipam,-cloud-node-lifecycle'; else echo '*,-nodeipam'; fi
}

cmd_up() {
  if alive kube-apiserver && api_healthy; then
    local running
    running=$(running_version)
    if [ -n "$running" ] && [ "$running" != "$K8S_VERSION" ]; then
      die "a Kubernetes $running cluster is up in $DDP_CLUSTER_DIR; take it down (cluster.sh down) to start $K8S_VERSION"
    fi
    if fake_nodes_enabled && ! alive kwok; then  # up before with DDP_NODES=0
      cmd_build
      fake_nodes_up
    fi
    log "already up ($K8S_VERSION): $KUBECONFIG_FILE"
    return 0
  fi
  [ -d "$PIDS" ] && cmd_down
  cmd_build
  # containerd's longest socket; a unix socket's path holds at most 107 bytes.
  local ttrpc=$CONTAINERD_SOCKET.ttrpc
  if node_enabled && [ ${#ttrpc} -gt 107 ]; then
    die "the node's socket $ttrpc is longer than a unix socket's 107 bytes: set DDP_CLUSTER_DIR to a shorter folder"
  fi
  local started=$SECONDS
  mkdir -p "$LOGS" "$PIDS" "$DDP_CLUSTER_DIR/etcd"
  echo "$K8S_VERSION" >"$DDP_CLUSTER_DIR/k8s-version"
  make_pki
  write_kubeconfig admin "$KUBECONFIG_FILE"
  write_kubeconfig controller-manager "$DDP_CLUSTER_DIR/controller-manager.kubeconfig"
  write_kubeconfig scheduler "$DDP_CLUSTER_DIR/scheduler.kubeconfig"
  write_kubeconfig kwok "$DDP_CLUSTER_DIR/kwok.kubeconfig"

  start etcd "$BIN_ETCD/etcd" --name local --data-dir "$DDP_CLUSTER_DIR/etcd" \
    --listen-client-urls "http://$BIND:$ETCD_PORT" --advertise-client-urls "http://$BIND:$ETCD_PORT" \
    --listen-peer-urls "http://$BIND:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://$BIND:$ETCD_PEER_PORT" \
    --initial-cluster "local=http://$BIND:$ETCD_PEER_PORT" --unsafe-no-fsync --quota-backend-bytes 4294967296
  # Each check also needs our process alive: a stray server on the same port must not pass for it.
  wait_for etcd 30 started_and etcd curl -sf "http://$BIND:$ETCD_PORT/health"

  # No endpoint reconciler: the kubernetes Service's endpoint would be 127.0.0.1, which 1.37 refuses;
  # pods reach the API server through the Service's address, DNAT'ed (node_network).
  start kube-apiserver "$BIN_K8S/kube-apiserver" \
    --etcd-servers "http://$BIND:$ETCD_PORT" \
    --bind-address "$BIND" --advertise-address "$BIND" --secure-port "$API_PORT" \
    --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --client-ca-file "$PKI/ca.crt" \
    --authorization-mode Node,RBAC \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --endpoint-reconciler-type none \
    --allow-privileged=true --enable-priority-and-fairness=false \
    --enable-admission-plugins PodNodeSelector,PodTolerationRestriction \
    --kubelet-preferred-address-types InternalIP \
    --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" \
    --kubelet-client-key "$PKI/apiserver-kubelet-client.key" --kubelet-certificate-authority "$PKI/ca.crt" \
    --profiling=false --v=1
  wait_for kube-apiserver 60 started_and kube-apiserver api_healthy

  start kube-controller-manager "$BIN_K8S/kube-controller-manager" \
    --kubeconfig "$DDP_CLUSTER_DIR/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$DDP_CLUSTER_DIR/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$DDP_CLUSTER_DIR/controller-manager.kubeconfig" \
    --bind-address "$BIND" --secure-port "$KCM_PORT" \
    --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
    --use-service-account-credentials=true \
    --cluster-cidr "$POD_CIDR" --service-cluster-ip-range "$SERVICE_CIDR" \
    --controllers "$(controllers)" \
    --leader-elect=false --profiling=false --v=1

  start kube-scheduler "$BIN_K8S/kube-scheduler" \
    --kubeconfig "$DDP_CLUSTER_DIR/scheduler.kubeconfig" \
    --authentication-kubeconfig "$DDP_CLUSTER_DIR/scheduler.kubeconfig" \
    --authorization-kubeconfig "$DDP_CLUSTER_DIR/scheduler.kubeconfig" \
    --bind-address "$BIND" --secure-port "$SCHED_PORT" \
    --leader-elect=false --profiling=false --v=1

  if fake_nodes_enabled; then start_kwok; fi
  if node_enabled; then node_up; fi
  if fake_nodes_enabled; then wait_for "fake nodes" 60 nodes_ready; fi
  wait_for "default service account" 60 kc -n default get serviceaccount default
  echo "$(date +%s)" >"$DDP_CLUSTER_DIR/up"
  log "Kubernetes $K8S_VERSION up in $((SECONDS - started)) s: $DDP_NODES nodes x $DDP_GPUS_PER_NODE nvidia.com/gpu; export KUBECONFIG=$KUBECONFIG_FILE"
  if [ -n "${DDP_CLUSTER_OWNER_PID:-}" ]; then watchdog "$DDP_CLUSTER_OWNER_PID"; fi
}

start_kwok() {
  start kwok "$BIN_KWOK/kwok" \
    --kubeconfig "$DDP_CLUSTER_DIR/kwok.kubeconfig" \
    --manage-all-nodes=false \
    --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \
    --node-ip 127.0.0.1 --cidr "$KWOK_CIDR" \
    --server-address "$BIND:$KWOK_PORT" \
    --node-lease-duration-seconds 40
  fake_nodes | kc apply -f - >/dev/null
}

# fake_nodes_up: kwok and its nodes into a cluster that is up without them.
fake_nodes_up() {
  start_kwok
  wait_for "fake nodes" 60 nodes_ready
  log "$DDP_NODES fake nodes x $DDP_GPUS_PER_NODE nvidia.com/gpu added"
}

nodes_ready() {
  local ready
  ready=$(kc get nodes -l type=kwok \
    -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | grep -c True)
  [ "$ready" -ge "$DDP_NODES" ]
}

# --- the real node ----------------------------------------------------------

source "$HERE/node.sh"

# watchdog PID: takes the cluster down once PID (a test session that started it) is gone,
# so a killed test run leaves no processes behind.
watchdog() {
  local owner=$1
  setsid bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 1; done; exec "$2" down' \
    watchdog "$owner" "$HERE/cluster.sh" >>"$LOGS/watchdog.log" 2>&1 </dev/null 3>&- &
  echo $! >"$PIDS/watchdog.pid"
}

cmd_down() {
  use_running_version
  if node_enabled; then node_down; fi
  if [ -d "$PIDS" ]; then
    local name pid
    for name in kwok kube-scheduler kube-controller-manager kube-apiserver etcd; do
      [ -f "$PIDS/$name.pid" ] || continue
      pid=$(cat "$PIDS/$name.pid")
      kill -TERM "$pid" 2>/dev/null || true
    done
    for name in "${COMPONENTS[@]}"; do
      [ -f "$PIDS/$name.pid" ] || continue
      pid=$(cat "$PIDS/$name.pid")
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -KILL "$pid" 2>/dev/null || true
      # A killed process lingers until the kernel has torn it down; down means gone.
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    done
    # The watchdog may be the caller; it is stopped last.
    if [ -f "$PIDS/watchdog.pid" ] && [ "$(cat "$PIDS/watchdog.pid")" != "$PPID" ]; then
      kill -TERM "$(cat "$PIDS/watchdog.pid")" 2>/dev/null || true
    fi
  fi
  # --one-file-system: should anything still be mounted below, it is left alone rather than emptied.
  rm -rf --one-file-system "$DDP_CLUSTER_DIR"
  log "down"
}

cmd_status() {
  local name rc=0
  use_running_version
  for name in "${COMPONENTS[@]}"; do
    if alive "$name"; then
      printf '%-24s running (pid %s)\n' "$name" "$(cat "$PIDS/$name.pid")"
    elif [ "$name" = kwok ] && [ ! -f "$PIDS/kwok.pid" ]; then
      printf '%-24s not started (up with DDP_NODES=0: no fake nodes)\n' "$name"
    else
      printf '%-24s stopped\n' "$name"
      rc=1
    fi
  done
  if [ $rc -eq 0 ] && api_healthy; then
    kc version 2>/dev/null | sed 's/^/  /'
    kc get nodes -o wide
  fi
  return $rc
}

cmd_env() {
  echo "export KUBECONFIG=$KUBECONFIG_FILE"
  if node_enabled; then
    echo "export PATH=$BIN_K8S:$BIN_HELM:$BIN_CONTAINERD:\$PATH"
    node_env
  else
    echo "export PATH=$BIN_K8S:$BIN_HELM:\$PATH"
  fi
}

# cmd_image_import ROOTFS REF [CONFIG]: makes an image of the folder ROOTFS and loads it into the
# node's containerd as REF (CONFIG: the image config as JSON, e.g. {"Cmd":["sh"]}).
cmd_image_import() {
  [ $# -ge 2 ] || die "usage: cluster.sh image-import ROOTFS REF [CONFIG_JSON]"
  [ -d "$1" ] || die "image-import: $1 is not a folder"
  local tar config='{}'
  [ $# -ge 3 ] && config=$3
  tar=$(mktemp --suffix .tar)
  # shellcheck disable=SC2064  # the name now: the script ends with this command, outside the function
  trap "rm -f '$tar'" EXIT
  oci_image "$1" "$2" "$config" "$tar"
  cmd_image_load "$tar" "$2"
}

# image_digest REF: the digest the node's image REF points at ('' if it has none).
image_digest() {
  ctr_node images ls "name==$1" 2>/dev/null | awk 'NR > 1 {print $3}'
}

# cmd_image_load TARBALL REF: imports the tarball, whose image is REF, into the node's containerd, and
# forgets the image REF pointed at before. The kubelet keeps every image it ran under its ID as well
# (a `sha256:` record, which outlives the tag moving on), so without this each rebuild of an image
# would keep the last one's layers on disk for good (3 GB a trainer build).
cmd_image_load() {
  [ $# -eq 2 ] || die "usage: cluster.sh image-load TARBALL REF"
  local previous current listing id
  previous=$(image_digest "$2")
  ctr_node images import "$1" >/dev/null || die "ctr could not import $1 (is the cluster up?)"
  current=$(image_digest "$2")
  [ -n "$current" ] || die "the node's containerd has no $2 after importing $1"
  [ -n "$previous" ] && [ "$previous" != "$current" ] || return 0
  listing=$(ctr_node images ls)
  # Another name for the previous image (a tag of its own) keeps it.
  if awk -v d="$previous" 'NR > 1 && $1 !~ /^sha256:/ && $3 == d' <<<"$listing" | grep -q .; then return 0; fi
  for id in $(awk -v d="$previous" 'NR > 1 && $1 ~ /^sha256:/ && $3 == d {print $1}' <<<"$listing"); do
    ctr_node images rm "$id" >/dev/null || die "could not remove $id, the previous $2, from the node's containerd"
  done
  log "the node's $2 is now $current; its previous image $previous is forgotten"
}

case "${1:-}" in
  build) cmd_build ;;
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  env) use_running_version; cmd_env ;;
  kubectl) shift; use_running_version; kc "$@" ;;
  ctr) shift; ctr_node "$@" ;;
  image-import) shift; cmd_image_import "$@" ;;
  image-load) shift; cmd_image_load "$@" ;;
  helm) shift; KUBECONFIG=$KUBECONFIG_FILE "$BIN_HELM/helm" "$@" ;;
  bindir) use_running_version; echo "$BIN_K8S:$BIN_HELM" ;;
  version) echo "$K8S_VERSION" ;;  # the Kubernetes release DDP_K8S_VERSION (or the default) picks
  releases) printf '%s\n' "${K8S_RELEASES[@]}" ;;  # those it can pick
  sign) shift; sign "$@" ;;  # NAME SUBJECT [SAN]: a key and certificate from the cluster CA in $PKI
  build-patched) shift; go_cache_scope build_patched "$@" ;;  # NAME MODULE OUT LDFLAGS PATCH... (kueue.sh's build)
  *) echo "usage: $0 build|up|down|status|env|version|releases|kubectl ARGS|helm ARGS|ctr ARGS|image-import ROOTFS REF [CONFIG]|image-load TARBALL REF" >&2; exit 2 ;;
esac
