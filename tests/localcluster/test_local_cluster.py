"""The control plane the other tests rely on is a real one: versions, scheduling, GC, RBAC. A second cluster
and real node, on ports, a bridge and folders of their own (beside the session's, whose tests go on), come up
and go down leaving nothing behind."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from ddp_contract import kubeclient
from fakenodes import on_fake_nodes
from kube import CLUSTER_SCRIPT, Cluster, cluster_script, k8s_version, local_kubeconfig, script_setting, wait_until
from procs import alive, ip_of, is_loopback, listening_addresses


def gpu_pod(name: str, gpus: int) -> dict:
    return {
        "metadata": {"name": name},
        "spec": on_fake_nodes(
            {"containers": [{"name": "main", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}
        ),
    }


def test_server_and_kubectl_report_the_pinned_version(cluster: Cluster, kubectl) -> None:
    versions = json.loads(kubectl("version", "-o", "json").stdout)
    server = versions["serverVersion"]
    if cluster.local:
        pinned = k8s_version()
        assert server["gitVersion"] == pinned
        assert versions["clientVersion"]["gitVersion"] == pinned
    else:
        assert (int(server["major"]), int(server["minor"].rstrip("+"))) >= (1, 33)


def test_gpu_pod_is_scheduled_onto_a_fake_node_and_runs(kube_api, namespace: str) -> None:
    core = client.CoreV1Api(kube_api)
    core.create_namespaced_pod(namespace, gpu_pod("one-gpu", 1))

    pod = wait_until(
        lambda: (p := core.read_namespaced_pod("one-gpu", namespace)).status.phase == "Running" and p,
        60,
        "the GPU pod to reach Running",
    )
    node = core.read_node(pod.spec.node_name)
    assert int(node.status.allocatable["nvidia.com/gpu"]) >= 1
    scheduled = {c.type: c.status for c in pod.status.conditions}
    assert scheduled["PodScheduled"] == "True"


def test_pod_asking_for_more_gpus_than_any_node_has_stays_pending(kube_api, namespace: str) -> None:
    core = client.CoreV1Api(kube_api)
    most = max(int(n.status.allocatable.get("nvidia.com/gpu", 0)) for n in core.list_node().items)
    core.create_namespaced_pod(namespace, gpu_pod("too-many", most + 1))

    def unschedulable_reason() -> str | None:
        conditions = core.read_namespaced_pod("too-many", namespace).status.conditions or []
        return next((c.message for c in conditions if c.type == "PodScheduled" and c.reason == "Unschedulable"), None)

    message = wait_until(unschedulable_reason, 30, "the scheduler to report the pod unschedulable")
    assert "nvidia.com/gpu" in message
    assert core.read_namespaced_pod("too-many", namespace).status.phase == "Pending"


def test_dependent_is_garbage_collected_when_its_owner_is_deleted(kube_api, namespace: str) -> None:
    core = client.CoreV1Api(kube_api)
    owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    reference = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "dependent", "ownerReferences": [reference]}})
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "bystander"}})

    core.delete_namespaced_config_map("owner", namespace)

    def dependent_gone() -> bool:
        try:
            core.read_namespaced_config_map("dependent", namespace)
            return False
        except ApiException as error:
            return error.status == 404

    wait_until(dependent_gone, 30, "the garbage collector to delete the dependent")
    assert core.read_namespaced_config_map("bystander", namespace).metadata.name == "bystander"


def test_service_account_is_refused_without_permission_and_allowed_with_it(kube_api, namespace: str) -> None:
    core = client.CoreV1Api(kube_api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "nobody"}})
    token = core.create_namespaced_service_account_token(
        "nobody", namespace, {"spec": {"expirationSeconds": 600}}
    ).status.token

    configuration = client.Configuration()
    configuration.host = kube_api.configuration.host
    configuration.ssl_ca_cert = kube_api.configuration.ssl_ca_cert
    configuration.api_key = {"authorization": f"Bearer {token}"}
    as_nobody = client.CoreV1Api(client.ApiClient(configuration))

    with pytest.raises(ApiException) as refused:
        as_nobody.list_namespaced_pod(namespace)
    assert refused.value.status == 403
    assert f"system:serviceaccount:{namespace}:nobody" in refused.value.body

    rbac = client.RbacAuthorizationV1Api(kube_api)
    rbac.create_namespaced_role(
        namespace,
        {"metadata": {"name": "pod-reader"}, "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]},
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "nobody-reads-pods"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "nobody", "namespace": namespace}],
        },
    )
    # The token was valid all along: with a binding the same identity may list pods.
    def allowed() -> bool:
        try:
            return as_nobody.list_namespaced_pod(namespace).items is not None
        except ApiException as error:
            if error.status != 403:
                raise
            return False  # the authorizer's cache has not seen the binding yet

    wait_until(allowed, 10, "the RoleBinding to take effect")


# --- the local control plane itself ------------------------------------------------------------


def real_node_addresses(kube_api) -> set[str]:
    """The InternalIP of each real node (kubelet with containerd): its pod bridge's gateway."""
    return {a.address for n in client.CoreV1Api(kube_api).list_node().items
            if (n.status.node_info.container_runtime_version or "").startswith("containerd://")
            for a in n.status.addresses if a.type == "InternalIP"}


def kube_api_port(kubeconfig: str) -> int:
    server = yaml.safe_load(Path(kubeconfig).read_text())["clusters"][0]["cluster"]["server"]
    return int(urlparse(server).port)


# A second, small cluster on ports of its own, so the session's cluster is left alone.
SECOND_CLUSTER = {
    "DDP_NODES": "1",
    "DDP_API_PORT": "17443",
    "DDP_ETCD_PORT": "13379",
    "DDP_ETCD_PEER_PORT": "13380",
    "DDP_KCM_PORT": "21257",
    "DDP_SCHED_PORT": "21259",
    "DDP_KWOK_PORT": "21247",
}
CONTROL_PLANE = script_setting("CONTROL_PLANE").strip("()").split()
K8S_RELEASES = script_setting("K8S_RELEASES").strip("()").split()


@pytest.mark.parametrize("release", K8S_RELEASES)
def test_each_release_is_built_from_a_wrapper_module_that_pins_it(release: str) -> None:
    minor = release.lstrip("v").rsplit(".", 1)[0]
    module = (CLUSTER_SCRIPT.parent / "go" / f"kubernetes-{minor}" / "go.mod").read_text()
    assert f"k8s.io/kubernetes {release}" in module.replace("\t", " ")


@pytest.mark.parametrize("wanted", ["1.30", "v1.30", "v1.30.14", "1.30.14"])
def test_ddp_k8s_version_picks_a_release_by_its_minor_or_in_full(wanted: str) -> None:
    assert cluster_script("version", env={"DDP_K8S_VERSION": wanted}).stdout.strip() == "v1.30.14"


@pytest.mark.parametrize("wanted", ["1.29", "1.3", "1", "v1.30.1", "latest"])
def test_a_kubernetes_release_the_cluster_does_not_build_is_refused_naming_those_it_does(wanted: str) -> None:
    result = cluster_script("version", env={"DDP_K8S_VERSION": wanted}, check=False)
    assert result.returncode != 0 and result.stdout == ""
    assert f"DDP_K8S_VERSION={wanted} is not a Kubernetes release" in result.stderr
    assert all(release in result.stderr for release in K8S_RELEASES)


def cluster_pids(kubeconfig: str) -> dict[str, int]:
    pid_dir = Path(kubeconfig).parent / "pids"
    return {f.stem: int(f.read_text()) for f in pid_dir.glob("*.pid")}


def test_local_cluster_listens_on_loopback_and_the_pod_bridge_only(cluster: Cluster, kube_api) -> None:
    if not cluster.local:
        pytest.fail("this checks the local control plane; unset DDP_TEST_KUBECONFIG to run it")
    pids = [pid for name, pid in cluster_pids(cluster.kubeconfig).items() if name != "watchdog"]
    addresses = listening_addresses(pids)
    api_port = kube_api_port(cluster.kubeconfig)
    assert f"{api_port:04X}" in {a.split(":")[1] for a in addresses}, "the API server's port was not found"
    # The real node's kubelet and cluster DNS serve pods on the bridge's gateway.
    beyond_loopback = {ip_of(a) for a in addresses if not is_loopback(a)}
    assert beyond_loopback <= real_node_addresses(kube_api), [ip_of(a) for a in addresses]


def test_second_cluster_up_is_idempotent_and_down_leaves_no_process(cluster: Cluster, tmp_path: Path) -> None:
    """Up twice, the second time with fake nodes: the first with DDP_NODES=0 (as `make demo` starts it) runs no
    kwok, and an up that wants fake nodes adds them to it, the rest of the control plane left running."""
    if not cluster.local:
        pytest.fail("this checks the local control plane; unset DDP_TEST_KUBECONFIG to run it")
    env = {**SECOND_CLUSTER, "DDP_CLUSTER_DIR": str(tmp_path / "second"), "DDP_REAL_NODE": "0"}
    try:
        for first_env in ({**env, "DDP_NODES": "0"}, env):  # up after down works
            cluster_script("up", env=first_env)
            kubeconfig = local_kubeconfig(env)
            first = cluster_pids(kubeconfig)
            wanted = set(CONTROL_PLANE) - ({"kwok"} if first_env["DDP_NODES"] == "0" else set())
            assert set(first) == wanted and all(alive(pid) for pid in first.values())
            assert len(fake_nodes(kubeconfig)) == int(first_env["DDP_NODES"])

            started = time.monotonic()
            again = cluster_script("up", env=first_env)
            assert "already up" in again.stderr
            assert time.monotonic() - started < 5
            assert cluster_pids(kubeconfig) == first

            running = k8s_version()
            other = next(release for release in K8S_RELEASES if release != running)
            refused = cluster_script("up", env={**env, "DDP_K8S_VERSION": other}, check=False)
            assert refused.returncode != 0
            assert f"a Kubernetes {running} cluster is up" in refused.stderr, refused.stderr
            assert cluster_pids(kubeconfig) == first

            assert cluster_script("status", env=env, check=False).returncode == 0
            if first_env is not env:
                grown = cluster_script("up", env=env)
                assert "fake nodes" in grown.stderr and "already up" in grown.stderr, grown.stderr
                now = cluster_pids(kubeconfig)
                assert set(now) == set(CONTROL_PLANE) and {name: now[name] for name in first} == first
                assert len(fake_nodes(kubeconfig)) == int(env["DDP_NODES"])
                first = now
            cluster_script("down", env=env)
            assert [name for name, pid in first.items() if alive(pid)] == []
            assert not (tmp_path / "second").exists()
            assert cluster_script("status", env=env, check=False).returncode != 0
    finally:
        cluster_script("down", env=env, check=False)


def fake_nodes(kubeconfig: str) -> list[str]:
    nodes = client.CoreV1Api(kubeclient.api_client(kubeconfig)).list_node(label_selector="type=kwok").items
    return [node.metadata.name for node in nodes]


# A second cluster's real node, apart from the session's: its own bridge, subnet, ports and containerd.
SECOND_NODE = {
    "DDP_BRIDGE": "ddpsecond0",
    "DDP_NODE_SUBNET": "10.244.201.0/24",
    "DDP_KUBELET_PORT": "21250",
    "DDP_KUBELET_HEALTHZ_PORT": "21248",
    "DDP_DNS_HEALTH_PORT": "21253",
}


def cni_results(bridge: str) -> list[str]:
    """libcni's cached results for the node's pods: its network's and the same sandboxes' loopback."""
    results = Path("/var/lib/cni/results")
    ours = list(results.glob(f"ddp-{bridge}-*"))
    sandboxes = [p.name.removeprefix(f"ddp-{bridge}-").rsplit("-", 1)[0] for p in ours]
    return [str(p) for p in ours] + [str(p) for s in sandboxes for p in results.glob(f"cni-loopback-{s}-*")]


def host_traces(bridge: str, folder: Path) -> dict[str, list[str]]:
    """What a real node leaves on the host: processes and mounts naming its folder, its bridge and
    the interfaces on it, its nftables table, its routes, its cgroups and libcni's cached results."""
    processes = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(folder) in cmdline.read_bytes().decode(errors="replace"):
                processes.append(cmdline.parent.name)
        except OSError:
            continue  # exited meanwhile
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(folder) in line]
    interfaces = [bridge] + [p.name for p in Path(f"/sys/class/net/{bridge}/brif").glob("*")]
    table = "ddp_" + bridge
    nft = subprocess.run(["nft", "list", "table", "ip", table], capture_output=True, text=True)
    routes = subprocess.run(["ip", "route", "show", "dev", bridge], capture_output=True, text=True).stdout.split("\n")
    return {
        "processes": processes,
        "mounts": mounts,
        "interfaces": [name for name in interfaces if Path(f"/sys/class/net/{name}").exists()],
        "nftables": [table] if nft.returncode == 0 else [],
        "routes": [r for r in routes if r.strip()],
        "cgroups": [str(p) for p in Path("/sys/fs/cgroup").glob(f"*/ddp.{bridge}")],
        "cni results": cni_results(bridge),
    }


@pytest.fixture
def short_folder() -> Iterator[Path]:
    """A folder of a short path for a second node, whose unix sockets' paths must fit in 107 bytes (the
    tmp_path of a pytest-xdist worker is too long)."""
    folder = Path(tempfile.mkdtemp(prefix="ddp-node-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_cluster_folder_too_long_for_the_node_s_sockets_is_refused_before_anything_starts(
        cluster: Cluster, tmp_path: Path) -> None:
    folder = tmp_path / ("x" * 80) / "second"
    result = cluster_script("up", env={**SECOND_CLUSTER, **SECOND_NODE, "DDP_CLUSTER_DIR": str(folder)}, check=False)
    assert result.returncode != 0
    assert f"the node's socket {folder}/node/containerd.sock.ttrpc is longer than a unix socket's 107 bytes: " \
           "set DDP_CLUSTER_DIR to a shorter folder" in result.stderr, result.stderr
    assert not folder.exists()


def test_cluster_down_leaves_nothing_of_the_real_node_behind(cluster: Cluster, short_folder: Path) -> None:
    if not cluster.local:
        pytest.fail("this checks the local control plane; unset DDP_TEST_KUBECONFIG to run it")
    env = {**SECOND_CLUSTER, **SECOND_NODE, "DDP_CLUSTER_DIR": str(short_folder / "second"),
           "DDP_CONTAINERD_ROOT": str(short_folder / "containerd")}
    try:
        cluster_script("up", env=env)
        kubeconfig = local_kubeconfig(env)
        pause = "registry.k8s.io/pause:" + script_setting("PAUSE_VERSION")
        pod = {"metadata": {"name": "sandboxed"},
               "spec": {"containers": [{"name": "main", "image": pause, "imagePullPolicy": "Never"}]}}
        api = kubeclient.api_client(kubeconfig)
        core = client.CoreV1Api(api)
        wait_until(lambda: core.list_namespaced_service_account("default").items, 30, "the default ServiceAccount")
        core.create_namespaced_pod("default", pod)
        wait_until(lambda: core.read_namespaced_pod("sandboxed", "default").status.phase == "Running", 60,
                   "the pod to run on the second cluster's real node")
        api.close()
        running = host_traces(SECOND_NODE["DDP_BRIDGE"], short_folder)
        # Each kind of trace is there while the pod runs, so its absence below means something.
        assert all(running.values()), running
        assert len(running["interfaces"]) >= 2, "the pod's veth on the bridge"

        cluster_script("down", env=env)
        assert host_traces(SECOND_NODE["DDP_BRIDGE"], short_folder) == {kind: [] for kind in running}
        # containerd's image store stays for the next up: imported images are not imported again.
        content = short_folder / "containerd" / "io.containerd.content.v1.content" / "blobs" / "sha256"
        assert len(list(content.iterdir())) >= 3, "the pause image's index, config and layer"
    finally:
        cluster_script("down", env=env, check=False)
