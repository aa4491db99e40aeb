"""The busybox image the tests run on the local cluster's real node, made from Debian's static busybox
and imported with `cluster.sh image-import` (nothing is pulled)."""

from __future__ import annotations

import json
import shutil
import subprocess
from ipaddress import ip_address
from pathlib import Path
from typing import Any

from kubernetes import client

import demo
from ddp_contract import api, labels
from kube import REPO, Jobs, cluster_script, wait_until

IMAGE = "docker.io/library/busybox:ddp-test"
ROOT_IMAGE = "docker.io/library/busybox:ddp-test-root"  # the same, run as root
BUSYBOX = Path("/bin/busybox")  # Debian's busybox-static, which cluster.sh build installs


def the_real_node(api: client.ApiClient) -> client.V1Node:
    """The node a kubelet with containerd runs (kwok's and the pod runner's report no runtime)."""
    nodes = [n for n in client.CoreV1Api(api).list_node().items
             if (n.status.node_info.container_runtime_version or "").startswith("containerd://")]
    assert len(nodes) == 1, f"expected the local cluster's one real node, found {[n.metadata.name for n in nodes]}"
    return nodes[0]


def node_address(node: client.V1Node) -> str:
    """The node's InternalIP: its pod bridge's gateway, where host servers that pods must reach listen."""
    address = next(a.address for a in node.status.addresses if a.type == "InternalIP")
    assert not ip_address(address).is_loopback, address
    return address


def trainer_image() -> str:
    """The trainer image `make images` tags with the chart's appVersion."""
    chart = (REPO / "charts" / "Chart.yaml").read_text()
    version = next(line.split(":", 1)[1].strip().strip('"') for line in chart.splitlines() if line.startswith("appVersion:"))
    return f"ddp-operator/trainer:{version}"


def create_job(jobs: Jobs, name: str, **spec: Any) -> None:
    """A DDPJob as a user would write it (2 CPU ranks unless `spec` says otherwise): no node steering,
    so its pods go to the real node (kwok's fake nodes are tainted)."""
    body = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name},
            "spec": {"worldSize": 2, "gpusPerRank": 0, **spec}}
    jobs.custom.create_namespaced_custom_object(api.GROUP, api.VERSION, jobs.namespace, api.PLURAL, body)


BUSYBOX_UID = 65534  # nobody


def import_busybox(root: Path, image: str = IMAGE, uid: int = BUSYBOX_UID) -> str:
    """A one-layer image of busybox with all its applets, running as `uid`, built in `root` and loaded
    into the node as `image`."""
    (root / "bin").mkdir()
    shutil.copy2(BUSYBOX, root / "bin" / "busybox")
    applets = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True, check=True).stdout.split()
    for applet in applets:
        if applet != "busybox":
            (root / "bin" / applet).symlink_to("busybox")
    (root / "etc").mkdir()
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/tmp:/bin/sh\n")
    (root / "etc" / "group").write_text("root:x:0:\nnogroup:x:65534:\n")
    (root / "tmp").mkdir()
    (root / "tmp").chmod(0o1777)
    # Non-root, as rank pods run unless their template says otherwise (the restricted Pod Security profile).
    config = {"Env": ["PATH=/bin"], "Cmd": ["sh"], "User": f"{uid}:{uid}"}
    cluster_script("image-import", str(root), image, json.dumps(config))
    return image


# The ranks' code of the real-node training tests: tests/trainer/ddp_workloads.py, as the ConfigMap
# `workloads` that WORKLOADS_TEMPLATE mounts on the trainer image's PYTHONPATH.
WORKLOADS = REPO / "tests" / "trainer" / "ddp_workloads.py"
WORKLOADS_TEMPLATE = {"spec": {
    "volumes": [{"name": "workloads", "configMap": {"name": "workloads"}}],
    "containers": [{"name": labels.CONTAINER_NAME, "volumeMounts": [
        {"name": "workloads", "mountPath": "/opt/ddp/examples/ddp_workloads.py", "subPath": WORKLOADS.name}]}]}}


def workloads_and_credentials(jobs: Jobs) -> None:
    """The ranks' code (ddp_workloads.py, as a ConfigMap) and S3 credentials (the Secret `s3-credentials`)
    in the test's namespace."""
    jobs.core.create_namespaced_config_map(jobs.namespace, {"metadata": {"name": "workloads"},
                                                            "data": {WORKLOADS.name: WORKLOADS.read_text()}})
    jobs.core.create_namespaced_secret(jobs.namespace, {"metadata": {"name": "s3-credentials"}, "stringData": {
        "AWS_ACCESS_KEY_ID": demo.ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": demo.SECRET_KEY}})


# Plain pods of the busybox image (or another, through `container`) on the real node.


def pod_body(name: str, script: str, **spec: Any) -> dict[str, Any]:
    """A pod of the busybox image running `sh -c script`; spec holds extra pod spec fields, and
    `container` extra container fields."""
    container = {"name": "main", "image": IMAGE, "imagePullPolicy": "Never", "command": ["sh", "-c", script],
                 **spec.pop("container", {})}
    return {"metadata": {"name": name, "labels": spec.pop("labels", {})},
            "spec": {"restartPolicy": "Never", "containers": [container], **spec}}


def describe(core: client.CoreV1Api, namespace: str, name: str) -> str:
    pod = core.read_namespaced_pod(name, namespace)
    events = [f"{e.reason}: {e.message}" for e in core.list_namespaced_event(namespace).items
              if e.involved_object.name == name]
    return f"phase {pod.status.phase}, containers {pod.status.container_statuses}, events {events}"


def wait_phase(core: client.CoreV1Api, namespace: str, name: str, phases: set[str], timeout: float = 60) -> client.V1Pod:
    def reached() -> client.V1Pod | None:
        pod = core.read_namespaced_pod(name, namespace)
        return pod if pod.status.phase in phases else None

    try:
        return wait_until(reached, timeout, f"pod {name} to reach {phases}")  # type: ignore[return-value]
    except AssertionError as error:
        raise AssertionError(f"{error}: {describe(core, namespace, name)}") from None


def run_pod(core: client.CoreV1Api, namespace: str, name: str, script: str, **spec: Any) -> client.V1Pod:
    """Creates the pod and returns it once Running."""
    core.create_namespaced_pod(namespace, pod_body(name, script, **spec))
    return wait_phase(core, namespace, name, {"Running"})


def run_to_end(core: client.CoreV1Api, namespace: str, name: str, script: str, **spec: Any) -> client.V1Pod:
    """Creates the pod and returns it once it has finished."""
    core.create_namespaced_pod(namespace, pod_body(name, script, **spec))
    return wait_phase(core, namespace, name, {"Succeeded", "Failed"})
