"""The control plane the other tests rely on is a real one: versions, scheduling, GC, RBAC."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from fakenodes import on_fake_nodes
from kube import Cluster, cluster_script, local_kubeconfig, script_setting, wait_until


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
        pinned = script_setting("K8S_VERSION")
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


def listening_addresses(pids: list[int]) -> list[str]:
    """The local addresses (hex ip:port as in /proc/net/tcp*) on which these processes listen."""
    inodes: set[str] = set()
    for pid in pids:
        fd_dir = Path(f"/proc/{pid}/fd")
        for fd in fd_dir.iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                found.append(fields[1])
    return found


def is_loopback(hex_address: str) -> bool:
    ip_hex = hex_address.split(":")[0]
    if len(ip_hex) == 8:
        return socket.inet_ntoa(bytes.fromhex(ip_hex)[::-1]).startswith("127.")
    return ip_hex == "00000000000000000000000001000000"  # ::1


def kube_api_port(kubeconfig: str) -> int:
    server = yaml.safe_load(Path(kubeconfig).read_text())["clusters"][0]["cluster"]["server"]
    return int(urlparse(server).port)


def cluster_pids(kubeconfig: str) -> dict[str, int]:
    pid_dir = Path(kubeconfig).parent / "pids"
    return {f.stem: int(f.read_text()) for f in pid_dir.glob("*.pid")}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def test_local_cluster_listens_on_loopback_only(cluster: Cluster) -> None:
    if not cluster.local:
        pytest.fail("this checks the local control plane; unset DDP_TEST_KUBECONFIG to run it")
    pids = [pid for name, pid in cluster_pids(cluster.kubeconfig).items() if name != "watchdog"]
    addresses = listening_addresses(pids)
    api_port = kube_api_port(cluster.kubeconfig)
    assert f"{api_port:04X}" in {a.split(":")[1] for a in addresses}, "the API server's port was not found"
    assert [a for a in addresses if not is_loopback(a)] == []


def test_second_cluster_up_is_idempotent_and_down_leaves_no_process(cluster: Cluster, tmp_path: Path) -> None:
    if not cluster.local:
        pytest.fail("this checks the local control plane; unset DDP_TEST_KUBECONFIG to run it")
    # A second, small cluster on other ports, so the session's cluster is left alone.
    env = {
        "DDP_CLUSTER_DIR": str(tmp_path / "second"),
        "DDP_NODES": "1",
        "DDP_API_PORT": "17443",
        "DDP_ETCD_PORT": "13379",
        "DDP_ETCD_PEER_PORT": "13380",
        "DDP_KCM_PORT": "21257",
        "DDP_SCHED_PORT": "21259",
        "DDP_KWOK_PORT": "21247",
    }
    try:
        for _ in range(2):  # up after down works
            cluster_script("up", env=env)
            kubeconfig = local_kubeconfig(env)
            first = cluster_pids(kubeconfig)
            assert len(first) == 5 and all(alive(pid) for pid in first.values())

            started = time.monotonic()
            again = cluster_script("up", env=env)
            assert "already up" in again.stderr
            assert time.monotonic() - started < 5
            assert cluster_pids(kubeconfig) == first

            assert cluster_script("status", env=env, check=False).returncode == 0
            cluster_script("down", env=env)
            assert [name for name, pid in first.items() if alive(pid)] == []
            assert not (tmp_path / "second").exists()
            assert cluster_script("status", env=env, check=False).returncode != 0
    finally:
        cluster_script("down", env=env, check=False)
