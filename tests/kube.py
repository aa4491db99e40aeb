"""Access to the Kubernetes API the tests run against.

By default the local control plane (localcluster/cluster.sh) is used, started if needed; set
DDP_TEST_KUBECONFIG to a kubeconfig to run the same tests against another cluster (kind, a real one).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
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


class OperatorProcess:
    """`python -m ddp_operator`, started and stopped by the tests."""

    def __init__(self, kubeconfig: str, log_path: Path) -> None:
        self.kubeconfig = kubeconfig
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        pythonpath = os.pathsep.join(str(REPO / p) for p in ("operator", "images/trainer"))
        env = {**os.environ, "KUBECONFIG": self.kubeconfig, "PYTHONPATH": pythonpath}
        log = self.log_path.open("a")
        starts = self._starts()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ddp_operator"], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO
        )
        wait_until(lambda: self._starts() > starts or self._died(), 60, "the operator to start")
        assert self.process.poll() is None, f"the operator exited:\n{self.log_path.read_text()[-3000:]}"

    def _starts(self) -> int:
        return self.log_path.read_text().count("ddp-operator started") if self.log_path.exists() else 0

    def _died(self) -> bool:
        return self.process is not None and self.process.poll() is not None

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def restart(self, kubeconfig: str | None = None) -> None:
        """Stops and starts the operator, with another identity if a kubeconfig is given."""
        self.stop()
        self.kubeconfig = kubeconfig or self.kubeconfig
        self.log_path.write_text(self.log_path.read_text() + "\n--- restart ---\n")
        self.start()


class Jobs:
    """DDPJobs in one test namespace, and the kubelet's part for their pods."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.namespace = namespace
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)

    def create(self, name: str, **spec: Any) -> dict[str, Any]:
        body = {
            "apiVersion": c.API_VERSION,
            "kind": c.KIND,
            "metadata": {"name": name},
            "spec": {"image": "trainer:test", "command": ["python", "train.py"], "gpusPerRank": 0, **spec},
        }
        return self.custom.create_namespaced_custom_object(c.GROUP, c.VERSION, self.namespace, c.PLURAL, body)

    def get(self, name: str) -> dict[str, Any] | None:
        try:
            return self.custom.get_namespaced_custom_object(c.GROUP, c.VERSION, self.namespace, c.PLURAL, name)
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def status(self, name: str) -> dict[str, Any]:
        job = self.get(name)
        return (job or {}).get("status") or {}

    def patch_spec(self, name: str, **spec: Any) -> None:
        self.custom.patch_namespaced_custom_object(c.GROUP, c.VERSION, self.namespace, c.PLURAL, name, {"spec": spec})

    def delete(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(c.GROUP, c.VERSION, self.namespace, c.PLURAL, name)

    def wait_phase(self, name: str, phase: str, timeout: float = 30) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            status = self.status(name)
            return status if status.get("phase") == phase else None

        try:
            return wait_until(reached, timeout, f"{name} to reach phase {phase}")  # type: ignore[return-value]
        except AssertionError as error:
            raise AssertionError(f"{error}; status is {self.status(name)}") from None

    def pods(self, name: str, include_deleting: bool = False) -> list[client.V1Pod]:
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=f"{c.LABEL_JOB_NAME}={name}").items
        return [p for p in pods if include_deleting or p.metadata.deletion_timestamp is None]

    def wait_pods(self, name: str, count: int, attempt: int | None = None, timeout: float = 30) -> list[client.V1Pod]:
        def settled() -> list[client.V1Pod] | None:
            pods = self.pods(name, include_deleting=True)
            if len(pods) != count or any(p.metadata.deletion_timestamp for p in pods):
                return None
            if attempt is not None and any(p.metadata.labels[c.LABEL_ATTEMPT] != str(attempt) for p in pods):
                return None
            return pods

        return wait_until(settled, timeout, f"{count} pods of {name} (attempt {attempt})")  # type: ignore[return-value]

    def finish(self, pod: str, exit_code: int, reason: str | None = None) -> None:
        """Plays the kubelet: the trainer container of `pod` terminated with exit_code."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        terminated = {"exitCode": exit_code, "reason": reason or ("Completed" if exit_code == 0 else "Error"),
                      "startedAt": now, "finishedAt": now}
        status = {
            "phase": "Succeeded" if exit_code == 0 else "Failed",
            "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [{"name": c.CONTAINER_NAME, "image": "trainer:test", "imageID": "", "ready": False,
                                   "restartCount": 0, "state": {"terminated": terminated}}],
        }
        self.core.patch_namespaced_pod_status(pod, self.namespace, {"status": status})

    def evict(self, pod: str) -> None:
        """Plays the kubelet evicting a pod under node pressure."""
        status = {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."}
        self.core.patch_namespaced_pod_status(pod, self.namespace, {"status": status})

    def events(self, name: str) -> list[client.CoreV1Event]:
        return [e for e in self.core.list_namespaced_event(self.namespace).items if e.involved_object.name == name]
