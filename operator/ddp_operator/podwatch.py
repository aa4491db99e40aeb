"""The operator's view of its own pods: a label-selected list+watch kept in memory.

kopf watches every object of a kind and filters labels on the client, so a busy cluster's pods
would all stream through the operator. This watch asks the API server for our pods only
(the job-name label selector), and keeps a slim copy of each, grouped by job.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from kubernetes import client

from ddp_contract.labels import LABEL_JOB_NAME
from ddp_operator.listwatch import ListWatch

JobKey = tuple[str, str]  # (namespace, job name)
OnChange = Callable[[JobKey], None]


def slim_pod(pod: dict) -> dict:
    """The fields the status computation reads, in the pod's own shape."""
    meta = pod.get("metadata", {})
    status = pod.get("status", {})
    return {
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
            "labels": meta.get("labels", {}),
            "deletionTimestamp": meta.get("deletionTimestamp"),
        },
        "spec": {"nodeName": pod.get("spec", {}).get("nodeName")},
        "status": {
            "phase": status.get("phase"),
            "reason": status.get("reason"),
            "message": status.get("message"),
            "startTime": status.get("startTime"),
            "conditions": [
                {"type": c.get("type"), "status": c.get("status"), "reason": c.get("reason"), "message": c.get("message")}
                for c in status.get("conditions", [])
            ],
            "containerStatuses": [
                {"name": c.get("name"), "ready": c.get("ready"), "restartCount": c.get("restartCount"),
                 "state": c.get("state", {})}
                for c in status.get("containerStatuses", [])
            ],
        },
    }


def job_key(pod: dict) -> JobKey | None:
    meta = pod.get("metadata", {})
    job = meta.get("labels", {}).get(LABEL_JOB_NAME)
    return (meta.get("namespace"), job) if job else None


class PodCache(ListWatch):
    def __init__(self, api: client.ApiClient, on_change: OnChange, watch_timeout: int = 300) -> None:
        super().__init__("pod", watch_timeout)
        self._core = client.CoreV1Api(api)
        self._on_change = on_change
        self._lock = threading.Lock()
        self._by_job: dict[JobKey, dict[str, dict]] = {}

    def pods(self, key: JobKey) -> list[dict]:
        with self._lock:
            return list(self._by_job.get(key, {}).values())

    def jobs_with(self, wanted: Callable[[dict], bool]) -> set[JobKey]:
        """The jobs that have a pod for which wanted(pod) is true."""
        with self._lock:
            return {key for key, pods in self._by_job.items() if any(wanted(pod) for pod in pods.values())}

    def _call(self, **kwargs: Any) -> Any:
        return self._core.list_pod_for_all_namespaces(label_selector=LABEL_JOB_NAME, **kwargs)

    def _replace(self, items: list[dict[str, Any]]) -> None:
        fresh: dict[JobKey, dict[str, dict]] = {}
        for pod in items:
            key = job_key(pod)
            if key:
                fresh.setdefault(key, {})[pod["metadata"]["name"]] = slim_pod(pod)
        with self._lock:
            changed = set(self._by_job) | set(fresh)
            self._by_job = fresh
        self._notify(changed)

    def _apply(self, kind: str, pod: dict[str, Any]) -> None:
        key = job_key(pod)
        if key is None:
            return
        name = pod["metadata"]["name"]
        with self._lock:
            pods = self._by_job.setdefault(key, {})
            if kind == "DELETED":
                pods.pop(name, None)
                if not pods:
                    del self._by_job[key]
            else:
                pods[name] = slim_pod(pod)
        self._notify([key])

    def _notify(self, keys: Iterable[JobKey]) -> None:
        for key in keys:
            if self.stopping:  # the operator is stopping: its event loop may be closed
                return
            self._on_change(key)
