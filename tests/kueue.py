"""Kueue for the tests: started on the local control plane by localcluster/kueue.sh, and the queues a
test needs (a ResourceFlavor, a ClusterQueue for the test's namespace alone, a LocalQueue in it),
deleted again while Kueue still runs to remove its finalizers."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from ddp_contract import api
from ddp_operator.kueue.rules import KUEUE_GROUP, KUEUE_VERSION, PRIORITY_CLASSES, WORKLOADS
from kube import REPO, wait_until

KUEUE_SCRIPT = REPO / "localcluster" / "kueue.sh"
LOCAL_QUEUE = "team"


def kueue_script(*args: str, env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(KUEUE_SCRIPT), *args], env={**os.environ, **(env or {})}, check=check,
                          capture_output=True, text=True)


def start_kueue(owner_pid: str) -> bool:
    """Starts Kueue unless it runs; True if it was started here (and is to be stopped by the caller, or by
    its watchdog should process `owner_pid` die first)."""
    if kueue_script("status", check=False).returncode == 0:
        return False
    result = kueue_script("up", env={"DDP_KUEUE_OWNER_PID": owner_pid}, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"Kueue failed to start:\n{result.stderr}")
    return True


def stop_kueue() -> None:
    result = kueue_script("down", check=False)
    assert result.returncode == 0, result.stderr


class Queues:
    """Kueue objects of one test: a ResourceFlavor and ClusterQueue named after its namespace."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.namespace = namespace
        self.suffix = uuid.uuid4().hex[:6]
        self.cluster_queue = f"cq-{self.suffix}"
        self.flavor = f"rf-{self.suffix}"
        self._cluster_scoped: list[tuple[str, str]] = []

    def create(self, cpu: str, preemption: str = "Never", flavors: Sequence[Mapping[str, Any]] = ({},),
               admission_checks: Sequence[str] = ()) -> str:
        """A LocalQueue backed by a ClusterQueue for this namespace only, with `cpu` of quota in each of
        `flavors` (ResourceFlavor specs, named flavor_name(i), which Kueue tries in order) and the named
        AdmissionChecks; its name."""
        for i, flavor in enumerate(flavors):
            self._create_cluster("resourceflavors", {"metadata": {"name": self.flavor_name(i)}, "spec": dict(flavor)})
        self._create_cluster("clusterqueues", {
            "metadata": {"name": self.cluster_queue},
            "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": self.namespace}},
                "preemption": {"withinClusterQueue": preemption},
                "resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
                    {"name": self.flavor_name(i), "resources": [{"name": "cpu", "nominalQuota": cpu}]}
                    for i in range(len(flavors))]}],
                **({"admissionChecksStrategy": {"admissionChecks": [{"name": name} for name in admission_checks]}}
                   if admission_checks else {}),
            },
        })
        self.custom.create_namespaced_custom_object(KUEUE_GROUP, KUEUE_VERSION, self.namespace, "localqueues", {
            "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", "kind": "LocalQueue",
            "metadata": {"name": LOCAL_QUEUE}, "spec": {"clusterQueue": self.cluster_queue}})
        wait_until(self._active, 30, f"ClusterQueue {self.cluster_queue} to be active")
        return LOCAL_QUEUE

    def flavor_name(self, i: int) -> str:
        return self.flavor if i == 0 else f"{self.flavor}-{i}"

    def set_quota(self, cpu: str) -> None:
        queue = self.custom.get_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", self.cluster_queue)
        queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] = cpu
        self.custom.replace_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", self.cluster_queue,
                                                  queue)

    def topology(self, *levels: str) -> str:
        """A Kueue Topology of these node labels, highest level first (cluster-scoped: named with this test's
        suffix); its name, for a flavor's topologyName."""
        name = f"topology-{self.suffix}"
        self._create_cluster("topologies", {"metadata": {"name": name},
                                            "spec": {"levels": [{"nodeLabel": level} for level in levels]}})
        return name

    def multikueue_check(self, kubeconfig_secret: str) -> str:
        """A MultiKueue AdmissionCheck that dispatches to one worker cluster, reached with the kubeconfig in
        the Secret `kubeconfig_secret` of Kueue's namespace (cluster-scoped objects named with this test's
        suffix); its name, for create(admission_checks=...)."""
        name = f"multikueue-{self.suffix}"
        self._create_cluster("multikueueclusters", {"metadata": {"name": name}, "spec": {"clusterSource": {
            "kubeConfig": {"locationType": "Secret", "location": kubeconfig_secret}}}})
        self._create_cluster("multikueueconfigs", {"metadata": {"name": name}, "spec": {"clusters": [name]}})
        self._create_cluster("admissionchecks", {"metadata": {"name": name}, "spec": {
            "controllerName": "kueue.x-k8s.io/multikueue",
            "parameters": {"apiGroup": KUEUE_GROUP, "kind": "MultiKueueConfig", "name": name}}})
        return name

    def priority_class(self, name: str, value: int) -> str:
        """A WorkloadPriorityClass (cluster-scoped: named with this test's suffix); its name."""
        full = f"{name}-{self.suffix}"
        self._create_cluster(PRIORITY_CLASSES, {"metadata": {"name": full}, "value": value})
        return full

    def workloads(self) -> list[dict[str, Any]]:
        return self.custom.list_namespaced_custom_object(KUEUE_GROUP, KUEUE_VERSION, self.namespace,
                                                         WORKLOADS)["items"]

    def workload_of(self, job: str) -> dict[str, Any] | None:
        return next((w for w in self.workloads() if w["metadata"]["name"].startswith(f"ddpjob-{job}-")), None)

    def cleanup(self, jobs: Any) -> None:
        """Deletes the test's jobs (their Workloads go with them), then its queues, and waits until
        all are gone: Kueue removes its finalizers only while it runs."""
        for job in jobs.custom.list_namespaced_custom_object(api.GROUP, api.VERSION, self.namespace, api.PLURAL)["items"]:
            jobs.delete(job["metadata"]["name"])
        wait_until(lambda: not self.workloads(), 60, f"the Workloads in {self.namespace} to be deleted")
        self._delete(lambda: self.custom.delete_namespaced_custom_object(
            KUEUE_GROUP, KUEUE_VERSION, self.namespace, "localqueues", LOCAL_QUEUE))
        for plural, name in reversed(self._cluster_scoped):
            self._delete(lambda p=plural, n=name: self.custom.delete_cluster_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, p, n))
        for plural, name in self._cluster_scoped:
            wait_until(lambda p=plural, n=name: not self._exists(p, n), 60, f"{plural} {name} to be deleted")

    def _create_cluster(self, plural: str, body: Mapping[str, Any]) -> None:
        kind = {"resourceflavors": "ResourceFlavor", "clusterqueues": "ClusterQueue", "topologies": "Topology",
                PRIORITY_CLASSES: "WorkloadPriorityClass", "multikueueclusters": "MultiKueueCluster",
                "multikueueconfigs": "MultiKueueConfig", "admissionchecks": "AdmissionCheck"}[plural]
        self.custom.create_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, plural, {
            "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", "kind": kind, **body})
        self._cluster_scoped.append((plural, body["metadata"]["name"]))

    def _active(self) -> bool:
        queue = self.custom.get_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", self.cluster_queue)
        return any(cond["type"] == "Active" and cond["status"] == "True"
                   for cond in (queue.get("status") or {}).get("conditions") or [])

    def _exists(self, plural: str, name: str) -> bool:
        try:
            self.custom.get_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, plural, name)
            return True
        except ApiException as error:
            if error.status == 404:
                return False
            raise

    @staticmethod
    def _delete(call: Any) -> None:
        try:
            call()
        except ApiException as error:
            if error.status != 404:
                raise

