"""Access to the Kubernetes API the tests run against.

By default the local control plane (localcluster/cluster.sh) is used, started if needed; set
DDP_TEST_KUBECONFIG to a kubeconfig to run the same tests against another cluster (kind, a real one).
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from ddp_operator import constants as c

REPO = Path(__file__).resolve().parent.parent
CLUSTER_SCRIPT = REPO / "localcluster" / "cluster.sh"
KUBECONFIG_ENV = "DDP_TEST_KUBECONFIG"
CRD_FILE = REPO / "crds" / "ddpjob.yaml"


@dataclass(frozen=True)
class Cluster:
    kubeconfig: str
    kubectl: str
    local: bool  # the control plane of localcluster/cluster.sh, not one named by DDP_TEST_KUBECONFIG
    started_here: bool


def cluster_script(*args: str, env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(CLUSTER_SCRIPT), *args],
        env={**os.environ, **(env or {})},
        check=check,
        capture_output=True,
        text=True,
    )


def script_setting(name: str) -> str:
    """A pinned setting (e.g. K8S_VERSION) as written at the top of cluster.sh."""
    for line in CLUSTER_SCRIPT.read_text().splitlines():
        if line.startswith(f"{name}="):
            return line.split("=", 1)[1]
    raise KeyError(f"{name} is not set in {CLUSTER_SCRIPT}")


def local_kubeconfig(env: dict[str, str] | None = None) -> str:
    for line in cluster_script("env", env=env).stdout.splitlines():
        if line.startswith("export KUBECONFIG="):
            return line.split("=", 1)[1]
    raise RuntimeError("cluster.sh env printed no KUBECONFIG")


def open_cluster() -> Cluster:
    external = os.environ.get(KUBECONFIG_ENV)
    if external:
        return Cluster(kubeconfig=external, kubectl="kubectl", local=False, started_here=False)
    was_up = cluster_script("status", check=False).returncode == 0
    if not was_up:
        # The watchdog takes the cluster down if this test process dies without cleaning up.
        result = cluster_script("up", env={"DDP_CLUSTER_OWNER_PID": str(os.getpid())}, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"local cluster failed to start:\n{result.stderr}")
    kubectl = cluster_script("bindir").stdout.strip().split(":")[0] + "/kubectl"
    return Cluster(kubeconfig=local_kubeconfig(), kubectl=kubectl, local=True, started_here=not was_up)


def wait_until(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.2) -> object:
    """Polls predicate until it returns something truthy; fails naming what was awaited."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def install_crd(kube_api: Any) -> None:
    """Creates or updates the CRD from crds/ddpjob.yaml and waits until it is served."""
    api = client.ApiextensionsV1Api(kube_api)
    body = yaml.safe_load(CRD_FILE.read_text())
    try:
        api.create_custom_resource_definition(body)
    except ApiException as error:
        if error.status != 409:
            raise
        body["metadata"]["resourceVersion"] = api.read_custom_resource_definition(c.CRD_NAME).metadata.resource_version
        api.replace_custom_resource_definition(c.CRD_NAME, body)

    def established() -> bool:
        conditions = api.read_custom_resource_definition(c.CRD_NAME).status.conditions or []
        return any(cond.type == "Established" and cond.status == "True" for cond in conditions)

    wait_until(established, 30, f"CRD {c.CRD_NAME} Established")
    custom = client.CustomObjectsApi(kube_api)
    wait_until(lambda: _served(custom), 30, f"{c.PLURAL} served")


def _served(custom: Any) -> bool:
    try:
        custom.list_cluster_custom_object(c.GROUP, c.VERSION, c.PLURAL, limit=1)
        return True
    except ApiException:
        return False
