"""The operator as a real process against the test cluster, and helpers to play the kubelet."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from ddp_operator import constants as c
from kube import REPO, Cluster, install_crd, wait_until


class OperatorProcess:
    """`python -m ddp_operator`, started and stopped by the tests."""

    def __init__(self, kubeconfig: str, log_path: Path) -> None:
        self.kubeconfig = kubeconfig
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        env = {**os.environ, "KUBECONFIG": self.kubeconfig, "PYTHONPATH": str(REPO / "operator")}
        log = self.log_path.open("a")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ddp_operator"], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO
        )
        wait_until(lambda: "ddp-operator started" in self.log_path.read_text() or self._died(), 60,
                   "the operator to start")
        assert self.process.poll() is None, f"the operator exited:\n{self.log_path.read_text()[-3000:]}"

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

    def restart(self) -> None:
        self.stop()
        self.log_path.write_text(self.log_path.read_text() + "\n--- restart ---\n")
        self.start()


@pytest.fixture(scope="session")
def crd(kube_api: Any) -> None:
    install_crd(kube_api)


@pytest.fixture(scope="session")
def operator(cluster: Cluster, crd: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    handle = OperatorProcess(cluster.kubeconfig, tmp_path_factory.mktemp("operator") / "operator.log")
    handle.start()
    yield handle
    handle.stop()
    assert "Traceback" not in handle.log_path.read_text(), handle.log_path.read_text()[-5000:]


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


@pytest.fixture
def jobs(kube_api: client.ApiClient, namespace: str, operator: OperatorProcess) -> Jobs:
    return Jobs(kube_api, namespace)
