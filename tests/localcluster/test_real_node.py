"""The local cluster's real node (kubelet, containerd, CNI bridge, CoreDNS) runs pods as a kubelet does:
addresses on the bridge, logs and exec, cluster DNS, volumes, secrets, limits, in-cluster API access.

The pods use a busybox image made here from Debian's static busybox and imported with
`cluster.sh image-import`: nothing is pulled. Select these tests with `pytest -m node`.
"""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import time
import uuid
from ipaddress import ip_address, ip_network
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from kube import Cluster, cluster_script, wait_until
from realnode import describe, import_busybox, pod_body, run_pod, run_to_end, trainer_image, wait_phase

pytestmark = pytest.mark.node

# PID 1 of most pods here: stops at once on SIGTERM, so deleting the pod is quick.
IDLE = "trap 'exit 0' TERM; while true; do sleep 0.2; done"
KUBERNETES_SERVICE_IP = "10.96.0.1"


# --- fixtures ----------------------------------------------------------------------------------


@pytest.fixture
def core(kube_api) -> client.CoreV1Api:
    return client.CoreV1Api(kube_api)


# --- helpers -----------------------------------------------------------------------------------


def logs(kubectl, namespace: str, name: str) -> str:
    return kubectl("logs", "-n", namespace, name).stdout


def in_pod(kubectl, namespace: str, name: str, script: str, check: bool = True) -> subprocess.CompletedProcess:
    return kubectl("exec", "-n", namespace, name, "--", "sh", "-c", script, check=check)


def gone(core: client.CoreV1Api, namespace: str, name: str) -> bool:
    try:
        core.read_namespaced_pod(name, namespace)
        return False
    except ApiException as error:
        if error.status != 404:
            raise
        return True


def delete_and_time(core: client.CoreV1Api, namespace: str, name: str) -> float:
    """Seconds from deleting the pod (its own grace period) until the kubelet has removed it."""
    started = time.monotonic()
    core.delete_namespaced_pod(name, namespace)
    wait_until(lambda: gone(core, namespace, name), 60, f"pod {name} to be removed")
    return time.monotonic() - started


# --- tests -------------------------------------------------------------------------------------


def test_an_ordinary_pod_runs_on_the_real_node_with_an_address_on_its_bridge(
        core, namespace: str, real_node: client.V1Node, busybox_image: str, kubectl) -> None:
    # No toleration, no node selector: kwok's fake nodes are tainted, the real node takes it.
    pod = run_pod(core, namespace, "plain", IDLE)

    assert pod.spec.node_name == real_node.metadata.name
    node = core.read_node(real_node.metadata.name)
    internal = next(a.address for a in node.status.addresses if a.type == "InternalIP")
    assert pod.status.host_ip == internal
    assert ip_address(pod.status.pod_ip) in ip_network(node.spec.pod_cidr), (pod.status.pod_ip, node.spec.pod_cidr)
    assert ip_address(internal) in ip_network(node.spec.pod_cidr)  # the node sits on the pods' bridge
    # The container sees the same address on its own interface.
    assert f"inet {pod.status.pod_ip}/" in in_pod(kubectl, namespace, "plain", "ip -4 addr show eth0").stdout


def test_kubectl_logs_and_exec_reach_the_container(core, namespace: str, busybox_image: str, kubectl) -> None:
    token = uuid.uuid4().hex
    run_pod(core, namespace, "chatty", f"echo said-{token}; {IDLE}")

    wait_until(lambda: f"said-{token}" in logs(kubectl, namespace, "chatty"), 20, "the pod's output in kubectl logs")
    assert in_pod(kubectl, namespace, "chatty", "cat /etc/hostname").stdout.strip() == "chatty"
    failed = in_pod(kubectl, namespace, "chatty", "echo to-stderr >&2; exit 3", check=False)
    assert failed.returncode == 3 and failed.stderr.splitlines()[0] == "to-stderr", failed.stderr


def test_pods_find_each_other_through_a_headless_service_and_talk_over_tcp(
        core, namespace: str, busybox_image: str, kubectl) -> None:
    service = {"metadata": {"name": "peers"},
               "spec": {"clusterIP": "None", "selector": {"app": "peers"}, "ports": [{"port": 7000}]}}
    core.create_namespaced_service(namespace, service)
    serve = "trap 'exit 0' TERM; while true; do echo \"pong from $(hostname)\" | nc -l -p 7000; done"
    pods = {name: run_pod(core, namespace, name, serve, hostname=name, subdomain="peers", labels={"app": "peers"})
            for name in ("first", "second")}

    for asker, target in (("first", "second"), ("second", "first")):
        for host in (f"{target}.peers.{namespace}.svc.cluster.local", f"{target}.peers.{namespace}.svc"):
            def answered() -> str | None:
                result = in_pod(kubectl, namespace, asker, f"nc -w 2 {host} 7000 </dev/null", check=False)
                return result.stdout.strip() if result.returncode == 0 and result.stdout.strip() else None

            assert wait_until(answered, 30, f"{asker} to reach {host}") == f"pong from {target}"
        # DNS gives the target's own pod address (no Service IP: the Service is headless).
        looked_up = in_pod(kubectl, namespace, asker, f"nslookup {target}.peers.{namespace}.svc.cluster.local").stdout
        assert f"Address: {pods[target].status.pod_ip}" in looked_up, looked_up


def test_memory_backed_empty_dir_is_a_dev_shm_of_the_requested_size(
        core, namespace: str, busybox_image: str, kubectl) -> None:
    volume = {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}}
    mount = {"name": "dshm", "mountPath": "/dev/shm"}
    run_pod(core, namespace, "shm", IDLE, volumes=[volume], container={"volumeMounts": [mount]})

    fields = in_pod(kubectl, namespace, "shm", "df -k /dev/shm | tail -1").stdout.split()
    assert (fields[0], int(fields[1])) == ("tmpfs", 64 * 1024), fields
    too_much = in_pod(kubectl, namespace, "shm", "dd if=/dev/zero of=/dev/shm/fill bs=1M count=80", check=False)
    assert too_much.returncode != 0 and "No space left" in too_much.stderr, too_much.stderr


def test_env_from_a_secret_and_the_security_context_reach_the_container(
        core, namespace: str, busybox_image: str, kubectl) -> None:
    secret = uuid.uuid4().hex
    core.create_namespaced_secret(namespace, {"metadata": {"name": "creds"}, "stringData": {"token": secret}})
    env = [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}}]
    pod = run_to_end(core, namespace, "secure", 'echo "uid=$(id -u) gid=$(id -g) token=$TOKEN"',
                     securityContext={"runAsUser": 4321, "runAsGroup": 8765}, container={"env": env})

    assert pod.status.phase == "Succeeded", describe(core, namespace, "secure")
    assert logs(kubectl, namespace, "secure").strip() == f"uid=4321 gid=8765 token={secret}"


# What client libraries do with in-cluster config: KUBERNETES_SERVICE_HOST/PORT, the mounted token and CA.
# Python's TLS (OpenSSL), not busybox wget's: from Kubernetes 1.35 (Go 1.25's defaults) the API server
# refuses a TLS 1.2 client that offers no signature algorithms, as busybox's own TLS does.
IN_CLUSTER_REVIEW = """
import json, os, ssl, urllib.request
account = "/var/run/secrets/kubernetes.io/serviceaccount/"
host = os.environ["KUBERNETES_SERVICE_HOST"]
request = urllib.request.Request(
    f"https://{host}:{os.environ['KUBERNETES_SERVICE_PORT']}/apis/authentication.k8s.io/v1/selfsubjectreviews",
    data=json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}).encode(),
    headers={"Authorization": "Bearer " + open(account + "token").read(), "Content-Type": "application/json"})
answer = urllib.request.urlopen(request, context=ssl.create_default_context(cafile=account + "ca.crt"))
print(json.dumps({"host": host, "review": json.load(answer)}))
"""


@pytest.mark.images
def test_a_pod_reaches_the_api_server_as_its_service_account_through_in_cluster_config(
        core, namespace: str, images_on_the_node: None, kubectl) -> None:
    body = pod_body("incluster", "", container={"image": trainer_image(), "command": ["python", "-c", IN_CLUSTER_REVIEW]})
    core.create_namespaced_pod(namespace, body)
    pod = wait_phase(core, namespace, "incluster", {"Succeeded", "Failed"}, timeout=120)

    assert pod.status.phase == "Succeeded", describe(core, namespace, "incluster") + logs(kubectl, namespace, "incluster")
    seen = json.loads(logs(kubectl, namespace, "incluster").splitlines()[-1])
    assert seen["host"] == KUBERNETES_SERVICE_IP
    assert seen["review"]["status"]["userInfo"]["username"] == f"system:serviceaccount:{namespace}:default"


def test_the_api_servers_certificate_is_valid_for_the_names_pods_use(cluster: Cluster, real_node: client.V1Node) -> None:
    config = yaml.safe_load(Path(cluster.kubeconfig).read_text())["clusters"][0]["cluster"]
    host, port = config["server"].removeprefix("https://").rsplit(":", 1)
    context = ssl.create_default_context(cafile=config["certificate-authority"])
    for name in (KUBERNETES_SERVICE_IP, "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"):
        with socket.create_connection((host, int(port)), timeout=10) as raw:
            with context.wrap_socket(raw, server_hostname=name) as tls:  # raises unless the certificate names it
                assert tls.version()


def test_a_container_over_its_memory_limit_is_oom_killed(core, namespace: str, busybox_image: str) -> None:
    # dd's 64 MiB buffer, filled from /dev/zero, does not fit the 32 MiB limit.
    pod = run_to_end(core, namespace, "greedy", "exec dd if=/dev/zero of=/dev/null bs=64M count=1",
                     container={"resources": {"limits": {"memory": "32Mi"}}})

    terminated = pod.status.container_statuses[0].state.terminated
    assert (pod.status.phase, terminated.reason, terminated.exit_code) == ("Failed", "OOMKilled", 137)


def test_deleting_a_pod_is_quick_when_it_handles_sigterm_and_waits_out_the_grace_period_when_not(
        core, namespace: str, busybox_image: str) -> None:
    grace = 10  # room for a node busy with other tests' pods
    run_pod(core, namespace, "polite", IDLE, terminationGracePeriodSeconds=grace)
    # PID 1 gets no default action for SIGTERM: without a handler the signal does nothing.
    run_pod(core, namespace, "deaf", "while true; do sleep 0.2; done", terminationGracePeriodSeconds=grace)

    assert delete_and_time(core, namespace, "polite") < grace / 2
    assert delete_and_time(core, namespace, "deaf") >= grace


def interface_with(address: str) -> str:
    """The name of this machine's interface that has `address`."""
    links = json.loads(subprocess.run(["ip", "-j", "-4", "addr"], capture_output=True, text=True, check=True).stdout)
    names = [link["ifname"] for link in links if any(a.get("local") == address for a in link.get("addr_info", []))]
    assert names, f"no interface of this machine has {address}"
    return names[0]


def test_the_pod_bridge_keeps_its_mac_address_while_pods_come_and_go(
        core, namespace: str, real_node: client.V1Node, busybox_image: str) -> None:
    """A bridge whose MAC address the kernel takes from its ports changes it as veths come and go;
    a pod that stays keeps sending to the old one until its neighbour entry expires, and a DNS query
    in that window waits out the resolver's 5 s timeout (an InPlace rank 0 resolving its own name
    while another rank's pod was replaced did, one restart in three)."""
    internal = next(a.address for a in real_node.status.addresses if a.type == "InternalIP")
    bridge = Path("/sys/class/net") / interface_with(internal)
    run_pod(core, namespace, "stays", IDLE)
    before = (bridge / "address").read_text().strip()
    for i in range(3):
        run_pod(core, namespace, f"passes-{i}", IDLE)
        delete_and_time(core, namespace, f"passes-{i}")
        assert (bridge / "address").read_text().strip() == before, f"pod passes-{i} changed the bridge's address"
    assert (bridge / "addr_assign_type").read_text().strip() == "3"  # NET_ADDR_SET: not a port's


def test_the_node_never_reclaims_disk_by_evicting_pods_or_deleting_images(kube_api, real_node: client.V1Node) -> None:
    """Its images were imported, not pulled: a kubelet that deleted one to free disk (image builds
    beside it fill the disk for a while) would leave every later pod of it in ImagePullBackOff."""
    raw = client.CoreV1Api(kube_api).connect_get_node_proxy_with_path(real_node.metadata.name, "configz",
                                                                       _preload_content=False)
    config = json.loads(raw.data)["kubeletconfig"]
    assert {k: config["evictionHard"][k] for k in ("nodefs.available", "imagefs.available")} == \
        {"nodefs.available": "0%", "imagefs.available": "0%"}, config["evictionHard"]  # the kubelet ignores 0%
    assert config["imageGCHighThresholdPercent"] == 100


def node_images() -> list[tuple[str, str]]:
    """(name, digest) of every image in the node's containerd (the kubelet's namespace)."""
    listing = cluster_script("ctr", "images", "ls").stdout.splitlines()[1:]
    return [(line.split()[0], line.split()[2]) for line in listing if line.strip()]


def test_an_image_loaded_again_leaves_nothing_of_the_one_before_on_the_node(
        core, namespace: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The kubelet keeps each image it ran under its ID too (`sha256:...`) after the tag moves on:
    loading a new build of a tag (as `make images` does) must forget the old one, or every build of
    the 3 GB trainer stays on the node's disk. A pod still running the old image keeps running."""
    ref = "docker.io/library/busybox:ddp-reloaded"
    import_busybox(tmp_path_factory.mktemp("first"), image=ref, uid=65531)  # no other tag has this image
    first = dict(node_images())[ref]
    run_pod(core, namespace, "on-the-first", IDLE, container={"image": ref})
    wait_until(lambda: any(name.startswith("sha256:") and digest == first for name, digest in node_images()), 30,
               "the kubelet's record of the first image under its ID")
    import_busybox(tmp_path_factory.mktemp("second"), image=ref, uid=65532)  # another user: another image
    images = node_images()
    second = dict(images)[ref]
    assert second != first
    assert [name for name, digest in images if digest == first] == [], images
    assert core.read_namespaced_pod("on-the-first", namespace).status.phase == "Running"
    run_pod(core, namespace, "on-the-second", IDLE, container={"image": ref})
