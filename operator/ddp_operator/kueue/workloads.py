"""The operator's view of the Kueue Workloads it created: a label-selected list+watch, by job, on the
pod cache's design (listwatch.JobObjects): one list+watch per namespace the operator serves when they
are named exactly (a Role in each is enough), else one for the whole cluster.

Started on the first job that names a Kueue queue, so a cluster without Kueue (or without queued
jobs) is never asked for Workloads. While the Workload API is not served (Kueue not installed, or
its CRDs not yet) or a namespace's Workloads may not be listed, `unavailable` says so and the watches
keep trying.
"""

from __future__ import annotations

import threading
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from ddp_contract.labels import LABEL_JOB_NAME
from ddp_operator.kueue.rules import KUEUE_GROUP, KUEUE_VERSION, WORKLOADS
from ddp_operator.listwatch import JobKey, JobObjects, OnChange


def slim_workload(workload: dict[str, Any]) -> dict[str, Any]:
    """What the operator reads of a Workload: identity, owner, whether it is active, and status: its
    conditions, and the admission with its admission checks' podSetUpdates (where the pods go)."""
    meta = workload.get("metadata") or {}
    status = workload.get("status") or {}
    slim_status: dict[str, Any] = {"conditions": status.get("conditions") or []}
    if status.get("admission"):
        slim_status["admission"] = status["admission"]
    checks = [{"name": check.get("name"), "podSetUpdates": check["podSetUpdates"]}
              for check in status.get("admissionChecks") or [] if check.get("podSetUpdates")]
    if checks:
        slim_status["admissionChecks"] = checks
    return {
        "metadata": {key: meta.get(key) for key in
                     ("name", "namespace", "uid", "resourceVersion", "generation", "labels", "ownerReferences",
                      "deletionTimestamp")},
        "spec": {"active": (workload.get("spec") or {}).get("active", True)},
        "status": slim_status,
    }


def unavailable_reason(synced: bool, error: ApiException | None) -> str | None:
    """Why Workloads cannot be seen yet, for the job's status; None once every watch has listed them."""
    if synced:
        return None
    if error is None:
        return "listing Kueue's Workloads"
    if error.status == 404:
        return (f"Kueue's Workload API ({WORKLOADS}.{KUEUE_GROUP}/{KUEUE_VERSION}) is not served: "
                "install Kueue, or remove the label")
    said = f"Kueue's Workloads cannot be listed: {error.status} {error.reason}"
    if error.status in (401, 403):
        return (f"{said}; the operator's ServiceAccount needs get, list, watch, create and patch on "
                f"{WORKLOADS}.{KUEUE_GROUP} (the chart's RBAC grants them)")
    return said


class WorkloadCache(JobObjects):
    def __init__(self, api: client.ApiClient, on_change: OnChange, watch_timeout: int = 300,
                 namespaces: tuple[str, ...] = ()) -> None:
        super().__init__("workload", on_change, watch_timeout, namespaces)
        self._custom = client.CustomObjectsApi(api)
        self._start_lock = threading.Lock()
        self._started = False

    def ensure_started(self) -> None:
        with self._start_lock:
            if self._started:
                return
            self._started = True
        self.start()

    def workloads(self, key: JobKey) -> list[dict[str, Any]]:
        """The Workloads labelled with the job's name (a job deleted and created again may briefly have two)."""
        return self.objects(key)

    def unavailable(self, namespace: str) -> str | None:
        """Why the namespace's Workloads cannot be seen yet; None once its watch has listed them."""
        return unavailable_reason(self.synced_in(namespace), self.error_in(namespace))

    def _slim(self, obj: dict[str, Any]) -> dict[str, Any]:
        return slim_workload(obj)

    def list_call(self, namespace: str | None, **kwargs: Any) -> Any:
        if namespace is None:
            return self._custom.list_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, WORKLOADS,
                                                           label_selector=LABEL_JOB_NAME, **kwargs)
        return self._custom.list_namespaced_custom_object(KUEUE_GROUP, KUEUE_VERSION, namespace, WORKLOADS,
                                                          label_selector=LABEL_JOB_NAME, **kwargs)
