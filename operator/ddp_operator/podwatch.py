"""The operator's view of its own pods: a label-selected list+watch kept in memory (one per namespace
when the operator watches a list of namespaces), on listwatch.JobObjects, as the Kueue Workloads'
cache (kueue/workloads.py) is.

kopf watches every object of a kind and filters labels on the client, so a busy cluster's pods
would all stream through the operator. This watch asks the API server for our pods only
(the job-name label selector), and keeps a slim copy of each, grouped by job.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client

from ddp_contract.labels import LABEL_JOB_NAME
from ddp_operator.listwatch import JobKey, JobObjects, OnChange
from ddp_operator.podstate import DEFAULT_SCHEDULER, CachedPod


def slim_pod(pod: dict) -> CachedPod:
    """The fields the status computation reads, in the pod's own shape; its reading kept with it."""
    meta = pod.get("metadata", {})
    status = pod.get("status", {})
    # A scheduler of the pod's own that never answers is said after a while (podstate.unanswered_for).
    scheduler = pod.get("spec", {}).get("schedulerName")
    own_scheduler = {"schedulerName": scheduler} if scheduler not in (None, DEFAULT_SCHEDULER) else {}
    return CachedPod({
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
            "labels": meta.get("labels", {}),
            "deletionTimestamp": meta.get("deletionTimestamp"),
            **({"creationTimestamp": meta.get("creationTimestamp")} if own_scheduler else {}),
            "ownerReferences": [{"uid": ref.get("uid"), "controller": ref.get("controller")}
                                for ref in meta.get("ownerReferences") or [] if ref.get("controller")],
        },
        # imagePullSecrets: a failed pull names what it was tried with (podsummary.pull_secrets_note).
        # containers' resources: what the job's pods hold on their nodes (topology.used_by_node).
        "spec": {"nodeName": pod.get("spec", {}).get("nodeName"),
                 "imagePullSecrets": pod.get("spec", {}).get("imagePullSecrets") or [],
                 "containers": [{"resources": x["resources"]} for x in pod.get("spec", {}).get("containers") or []
                                if x.get("resources")], **own_scheduler},
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
    })


class PodCache(JobObjects):
    """Our pods (by the job-name label)."""

    def __init__(self, api: client.ApiClient, on_change: OnChange, watch_timeout: int = 300,
                 namespaces: tuple[str, ...] = ()) -> None:
        super().__init__("pod", on_change, watch_timeout, namespaces)
        self._core = client.CoreV1Api(api)

    def pods(self, key: JobKey) -> list[dict]:
        return self.objects(key)

    def _slim(self, obj: dict[str, Any]) -> dict[str, Any]:
        return slim_pod(obj)

    def list_call(self, namespace: str | None, **kwargs: Any) -> Any:
        if namespace is None:
            return self._core.list_pod_for_all_namespaces(label_selector=LABEL_JOB_NAME, **kwargs)
        return self._core.list_namespaced_pod(namespace, label_selector=LABEL_JOB_NAME, **kwargs)
