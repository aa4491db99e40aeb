# The real node of the local cluster, sourced by cluster.sh (which defines the settings, start,
# alive, wait_for, kc, log and die): an upstream kubelet with containerd and runc, CNI bridge
# networking on a private bridge, CoreDNS for cluster.local and a DNAT rule that lets pods reach the
# API server at the kubernetes Service's address. Everything it starts listens on 127.0.0.1 or on
# the bridge's gateway address; node_down removes every process, mount, interface, nftables table
# and cgroup it made.

# ctr_node ARGS...: ctr against the node's containerd, in the namespace the kubelet uses.
ctr_node() { "$BIN_CONTAINERD/ctr" --address "$CONTAINERD_SOCKET" --namespace k8s.io "$@"; }

# stop NAME: stops a started process (TERM, then KILL after 5 s) and waits until it is gone.
stop() {
  local name=$1 pid
  [ -f "$PIDS/$name.pid" ] || return 0
  pid=$(cat "$PIDS/$name.pid")
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
}

# node_network: the pod bridge with the gateway address, and the DNAT rule from the kubernetes
# Service's address to the API server (no kube-proxy here); route_localnet lets the DNAT'ed
# packets reach the API server on 127.0.0.1. The bridge's MAC address is set (locally
# administered, from the gateway's address): one left to the kernel follows the lowest of its
# ports' and changes as pods come and go, and pods that stay send to the old one until their
# neighbour entry expires (a DNS query then waits out the resolver's 5 s timeout).
node_network() {
  if ip link show "$BRIDGE" >/dev/null 2>&1; then
    die "interface $BRIDGE exists already: another local cluster uses it (give this one DDP_BRIDGE and DDP_NODE_SUBNET), or run cluster.sh down"
  fi
  local mac
  mac=$(printf '02:00:%02x:%02x:%02x:%02x' ${NODE_GATEWAY//./ })
  ip link add "$BRIDGE" address "$mac" type bridge
  touch "$NODE_DIR/network"  # this cluster made the bridge: its down removes it
  ip addr add "$NODE_GATEWAY/${NODE_SUBNET#*/}" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  sysctl -qw "net.ipv4.conf.$BRIDGE.route_localnet=1"
  nft -f - <<EOF
table ip $NFT_TABLE {
  chain prerouting {
    type nat hook prerouting priority dstnat; policy accept;
    iifname "$BRIDGE" ip daddr $KUBERNETES_SERVICE_IP tcp dport 443 dnat to $BIND:$API_PORT
  }
}
EOF
}

# cgroup_hierarchies: the mounted cgroup v1 hierarchies (the kubelet runs with cgroupfs on v1).
cgroup_hierarchies() { awk '$3 == "cgroup" {print $2}' /proc/self/mounts; }

# cgroup_mounts: every cgroup mount, v1 and v2: runc also files containers under this VM's cgroup2 mount.
cgroup_mounts() { awk '$3 == "cgroup" || $3 == "cgroup2" {print $2}' /proc/self/mounts; }

# node_cgroups: the kubelet's cgroupRoot in every hierarchy (cpuset needs its cpus and mems filled).
node_cgroups() {
  local h
  for h in $(cgroup_hierarchies); do
    mkdir -p "$h/$NODE_CGROUP"
    if [ -f "$h/cpuset.cpus" ]; then
      cat "$h/cpuset.cpus" >"$h/$NODE_CGROUP/cpuset.cpus"
      cat "$h/cpuset.mems" >"$h/$NODE_CGROUP/cpuset.mems"
    fi
  done
}

write_containerd_config() {
  cat >"$NODE_DIR/containerd.toml" <<EOF
version = 3
root = "$CONTAINERD_ROOT"
state = "$NODE_DIR/containerd-state"
imports = []
# Plugins that would use fixed host paths (/opt/containerd, /var/run/nri) shared by every instance.
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.internal.v1.opt", "io.containerd.image-verifier.v1.bindir"]

[grpc]
  address = "$CONTAINERD_SOCKET"

[ttrpc]
  address = "$NODE_DIR/containerd.sock.ttrpc"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  # Per-registry settings (a CA, a mirror) as <host:port>/hosts.toml, read at each pull: a registry
  # is added while the node runs.
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = "$NODE_DIR/certs.d"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "$PAUSE_IMAGE"

[plugins.'io.containerd.cri.v1.runtime']
  # This VM withholds CAP_SYS_RESOURCE: runc could not lower oom_score_adj below containerd's own.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "$BIN_RUNC/runc"
        Root = "$NODE_DIR/runc"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["$BIN_CNI"]
    conf_dir = "$NODE_DIR/cni/net.d"

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "$BIND"
  stream_server_port = "0"
EOF
}

write_cni_config() {
  cat >"$NODE_DIR/cni/net.d/10-ddp.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$CNI_NETWORK",
  "plugins": [
    {
      "type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
      "ipam": {
        "type": "host-local", "dataDir": "$NODE_DIR/cni/ipam",
        "ranges": [[{"subnet": "$NODE_SUBNET", "gateway": "$NODE_GATEWAY"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "backend": "nftables", "capabilities": {"portMappings": true}}
  ]
}
EOF
}

# write_corefile: cluster.local from the API server, on the gateway only. No cache plugin: a
# negative answer cached before a peer's EndpointSlice exists would hide it for the cache's TTL.
write_corefile() {
  cat >"$NODE_DIR/Corefile" <<EOF
cluster.local:53 in-addr.arpa:53 {
  bind $NODE_GATEWAY
  errors
  health $BIND:$DNS_HEALTH_PORT
  kubernetes cluster.local in-addr.arpa {
    kubeconfig $NODE_DIR/coredns.kubeconfig ddp-local
    ttl 0
  }
}
EOF
}

# cgroup_v1_setting: what lets this kubelet run on cgroup v1 (failCgroupV1 came in 1.31; it defaults to
# true from 1.35).
cgroup_v1_setting() {
  if [ "$K8S_MINOR" -ge 31 ]; then echo 'failCgroupV1: false'; else echo '# (no failCgroupV1 before 1.31)'; fi
}

# The images imported into the node (make images, the tests' busybox, the pause image) are never checked
# against a registry: nothing can pull them. The kubelet's default policy (from 1.35, KEP-2535) stops
# treating an image as preloaded once it has pulled the same image ID with credentials, as the registry
# test does with the images it pushes, and every later pod of the imported name then tried a pull. The
# kubelet matches the name as the pod writes it, without its tag, so both spellings of ours are listed.
pull_verification_setting() {
  if [ "$K8S_MINOR" -ge 35 ]; then
    printf '%s\n' 'imagePullCredentialsVerificationPolicy: NeverVerifyAllowlistedImages' \
      'preloadedImagesVerificationAllowlist:' '- docker.io/ddp-operator/*' '- ddp-operator/*' \
      '- docker.io/library/busybox' '- registry.k8s.io/pause'
  else
    echo '# (the kubelet verifies no pull credentials of present images before 1.35)'
  fi
}

write_kubelet_config() {
  cat >"$NODE_DIR/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_GATEWAY
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: $BIND
healthzPort: $KUBELET_HEALTHZ_PORT
tlsCertFile: $PKI/kubelet-serving.crt
tlsPrivateKeyFile: $PKI/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
containerRuntimeEndpoint: unix://$CONTAINERD_SOCKET
# This VM is cgroup v1 (with a cgroup2 mount beside it), and has swap settings of its own.
$(cgroup_v1_setting)
cgroupDriver: cgroupfs
cgroupRoot: /$NODE_CGROUP
failSwapOn: false
clusterDomain: cluster.local
clusterDNS: [$NODE_GATEWAY]
podLogsDir: $NODE_DIR/pod-logs
# A shared development machine: never reclaim disk by evicting pods or deleting images (0%: as kind's
# nodes), since the images were imported, not pulled, and cannot be pulled again; image builds beside
# the node briefly fill the disk, and a reclaim then deleted the trainer image mid-test.
evictionHard: {memory.available: 50Mi, nodefs.available: "0%", imagefs.available: "0%", nodefs.inodesFree: "0%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
$(pull_verification_setting)
EOF
}

# node_rbac: the API server's kubelet client may use the kubelet API (logs, exec); CoreDNS may read
# what it serves.
node_rbac() {
  kc apply -f - >/dev/null <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "ddp:apiserver-kubelet-client"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:kubelet-api-admin"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: kube-apiserver-kubelet-client}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "ddp:coredns"}
rules:
- {apiGroups: [""], resources: [endpoints, services, pods, namespaces], verbs: [list, watch]}
- {apiGroups: [discovery.k8s.io], resources: [endpointslices], verbs: [list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "ddp:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "ddp:coredns"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: "ddp:coredns"}]
EOF
}

# import_pause: the sandbox image, unless containerd has it from an earlier run.
import_pause() {
  if [ -z "$(ctr_node images ls -q "name==$PAUSE_IMAGE" 2>/dev/null)" ]; then
    ctr_node images import "$BIN_PAUSE/pause.tar" >/dev/null
  fi
}

node_field() {
  kc get node "$NODE_NAME" -o jsonpath="$1" 2>/dev/null
}

node_ready() { [ "$(node_field '{.status.conditions[?(@.type=="Ready")].status}')" = True ]; }

node_up() {
  local started=$SECONDS
  mkdir -p "$NODE_DIR/certs.d" "$NODE_DIR/cni/net.d" "$NODE_DIR/cni/ipam" "$NODE_DIR/kubelet" "$NODE_DIR/pod-logs" "$CONTAINERD_ROOT"
  node_network
  node_cgroups
  write_containerd_config
  write_cni_config
  start containerd env PATH="$BIN_CONTAINERD:$BIN_RUNC:$PATH" "$BIN_CONTAINERD/containerd" --config "$NODE_DIR/containerd.toml"
  wait_for containerd 30 started_and containerd ctr_node version
  import_pause

  node_rbac
  write_kubeconfig coredns "$NODE_DIR/coredns.kubeconfig"
  write_corefile
  start coredns "$BIN_COREDNS/coredns" -conf "$NODE_DIR/Corefile"
  wait_for coredns 30 started_and coredns curl -sf "http://$BIND:$DNS_HEALTH_PORT/health"

  write_kubeconfig node "$NODE_DIR/kubelet.kubeconfig"
  write_kubelet_config
  start kubelet "$BIN_KUBELET/kubelet" --config "$NODE_DIR/kubelet.yaml" \
    --kubeconfig "$NODE_DIR/kubelet.kubeconfig" --root-dir "$NODE_DIR/kubelet" \
    --hostname-override "$NODE_NAME" --node-ip "$NODE_GATEWAY" --v=1
  wait_for "node $NODE_NAME registered" 60 started_and kubelet node_field '{.metadata.name}'
  # No node IPAM runs (kwok's nodes have fake IPs); the node's pod CIDR is its bridge's subnet.
  kc patch node "$NODE_NAME" --type merge -p "{\"spec\":{\"podCIDR\":\"$NODE_SUBNET\",\"podCIDRs\":[\"$NODE_SUBNET\"]}}" >/dev/null
  wait_for "node $NODE_NAME Ready" 60 started_and kubelet node_ready
  log "real node $NODE_NAME ready in $((SECONDS - started)) s (pods on $BRIDGE, $NODE_SUBNET; containerd at $CONTAINERD_SOCKET)"
}

# --- down --------------------------------------------------------------------

# pod_networks_left: whether a pod's network is still set up (libcni caches each result until DEL).
pod_networks_left() { compgen -G "$CNI_RESULTS/$CNI_NETWORK-*" >/dev/null; }

# drain_node: while the API server and the kubelet are up, the kubelet stops the node's pods itself,
# so the CNI plugins tear down what they set up (addresses, host ports).
drain_node() {
  alive kubelet && alive containerd && alive kube-apiserver && api_healthy || return 0
  kc delete pods --all-namespaces --field-selector "spec.nodeName=$NODE_NAME" --grace-period=0 --force \
    --wait=false >/dev/null 2>&1 || true
  local deadline=$((SECONDS + 20))
  while pod_networks_left && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
}

# remove_containers: whatever containers containerd still has (the kubelet was gone, or too slow).
remove_containers() {
  alive containerd || return 0
  local id
  for id in $(ctr_node containers ls -q 2>/dev/null); do
    ctr_node tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true
    ctr_node tasks rm -f "$id" >/dev/null 2>&1 || true
    ctr_node containers rm "$id" >/dev/null 2>&1 || true
  done
  # The sandboxes' records too: containerd's store outlives the cluster, and would try to recover them.
  for id in $(ctr_node sandboxes ls 2>/dev/null | awk 'NR > 1 {print $1}'); do
    ctr_node sandboxes rm -f "$id" >/dev/null 2>&1 || true
  done
}

# node_pids: processes of this node that outlive containerd: its shims (found by the socket they
# serve) and anything left in the pods' cgroups.
node_pids() {
  local f h
  for f in $(grep -lasF -- "$CONTAINERD_SOCKET" /proc/[0-9]*/cmdline); do
    if [ "$(tr '\0' '\n' 2>/dev/null <"$f" | head -1)" = containerd-shim-runc-v2 ]; then
      f=${f#/proc/}
      echo "${f%/cmdline}"
    fi
  done
  for h in $(cgroup_mounts); do
    if [ -d "$h/$NODE_CGROUP" ]; then find "$h/$NODE_CGROUP" -name cgroup.procs -exec cat {} + 2>/dev/null; fi
  done
  return 0
}

kill_leftovers() {
  local pids
  pids=$(node_pids | sort -u)
  [ -n "$pids" ] || return 0
  # shellcheck disable=SC2086  # one pid a word
  kill -KILL $pids 2>/dev/null || true
  local deadline=$((SECONDS + 10))
  while [ -n "$(node_pids)" ] && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
}

# node_mounts: mount points below the node's folders, deepest first.
node_mounts() {
  awk -v a="$NODE_DIR/" -v b="$CONTAINERD_ROOT/" 'index($5, a) == 1 || index($5, b) == 1 {print length($5), $5}' \
    /proc/self/mountinfo | sort -rn | cut -d' ' -f2-
}

unmount_all() {
  local m
  for m in $(node_mounts); do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "could not unmount $m"
  done
}

remove_cgroups() {
  local h
  for h in $(cgroup_mounts); do
    if [ -d "$h/$NODE_CGROUP" ]; then find "$h/$NODE_CGROUP" -depth -type d -exec rmdir {} + 2>/dev/null || true; fi
  done
}

# forget_pod_networks: libcni's cached results of pods the kubelet did not get to stop: the pod
# network's (named after the network) and their loopback's (named after the same sandbox).
forget_pod_networks() {
  local f id
  for f in "$CNI_RESULTS/$CNI_NETWORK"-*; do
    [ -e "$f" ] || continue
    id=${f#"$CNI_RESULTS/$CNI_NETWORK-"}
    rm -f "$f" "$CNI_RESULTS/cni-loopback-${id%-*}-lo"
  done
}

node_down() {
  # Only what this cluster set up: another cluster may use the same bridge name.
  [ -f "$NODE_DIR/network" ] || return 0
  drain_node
  stop kubelet
  remove_containers
  stop coredns
  stop containerd
  kill_leftovers
  unmount_all
  ip link del "$BRIDGE" 2>/dev/null || true
  nft delete table ip "$NFT_TABLE" 2>/dev/null || true
  remove_cgroups
  forget_pod_networks
  # The kubelet's links in /var/log/containers (a fixed path) to this node's pod logs.
  find /var/log/containers -maxdepth 1 -type l -lname "$NODE_DIR/*" -delete 2>/dev/null || true
}

# node_env: what a shell needs to use the node's containerd (ctr images import ...).
node_env() {
  echo "export CONTAINERD_ADDRESS=$CONTAINERD_SOCKET"
  echo "export CONTAINERD_NAMESPACE=k8s.io"
}
