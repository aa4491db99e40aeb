"""Jobs, pods, nodes and summaries as the API returns them, for the operator's unit tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from ddp_contract import labels
from ddp_contract.timestamps import rfc3339
from ddp_operator.podsummary import PodSummary, summarize_pods
from ddp_operator.spec import parse_spec

NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
EARLIER = NOW - timedelta(minutes=10)
JOB = "mnist"


def job_spec(**changes: Any) -> Any:
    return parse_spec({"worldSize": 2, "image": "trainer:1", "entrypoint": "train:main", **changes})


def pod(
    rank: int,
    state: str = "running",
    attempt: int = 0,
    exit_code: int | None = None,
    reason: str | None = None,
    ready: bool = True,
    deleting: bool = False,
    finished_at: str = "2025-01-02T03:00:00Z",
    waiting: str | None = None,
    node: str | None = None,
    output: str | None = None,
    unschedulable: str | None = None,
    waiting_message: str | None = None,
) -> dict[str, Any]:
    """A pod as the API returns it. state: pending | running | succeeded | failed | evicted."""
    meta: dict[str, Any] = {
        "name": f"{JOB}-{rank}",
        "uid": f"uid-{rank}-{attempt}",
        "labels": {labels.LABEL_JOB_NAME: JOB, labels.LABEL_RANK: str(rank), labels.LABEL_ATTEMPT: str(attempt)},
    }
    if deleting:
        meta["deletionTimestamp"] = "2025-01-02T03:04:00Z"
    container: dict[str, Any] = {"name": labels.CONTAINER_NAME, "state": {}}
    status: dict[str, Any] = {"phase": "Pending", "containerStatuses": [container], "conditions": []}
    if state == "pending" and unschedulable is not None:  # as the scheduler leaves it: no containers yet
        status.update(containerStatuses=[], conditions=[
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": unschedulable}])
    elif state == "pending":
        container["state"] = {"waiting": {"reason": waiting or "ContainerCreating",
                                          **({"message": waiting_message} if waiting_message else {})}}
    elif state == "running":
        status["phase"] = "Running"
        container["state"] = {"running": {"startedAt": "2025-01-02T02:00:00Z"}}
        status["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
    elif state in ("succeeded", "failed"):
        code = exit_code if exit_code is not None else (0 if state == "succeeded" else 1)
        status["phase"] = "Succeeded" if code == 0 else "Failed"
        container["state"] = {
            "terminated": {
                "exitCode": code,
                "reason": reason or ("Completed" if code == 0 else "Error"),
                "finishedAt": finished_at,
                **({"message": output} if output else {}),
            }
        }
    elif state == "evicted":
        status.update(phase="Failed", reason=reason or "Evicted", containerStatuses=[])
    return {"metadata": meta, "spec": {"nodeName": node} if node else {}, "status": status}


def summary_of(*pods: dict[str, Any], attempt: int = 0) -> PodSummary:
    return summarize_pods(list(pods), attempt, job_name=JOB)


def api_node(name: str, ready: str = "True", since: Any = None, gpus: int = 8, cpu: str = "64", memory: str = "512Gi",
             taints: list[dict[str, str]] | None = None, labels: dict[str, str] | None = None,
             unschedulable: bool = False, reason: str = "KubeletReady") -> dict[str, Any]:
    """A Node as the API returns it."""
    stamp = rfc3339(since or NOW - timedelta(hours=1))
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"taints": taints or [], **({"unschedulable": True} if unschedulable else {})},
        "status": {
            "allocatable": {"cpu": cpu, "memory": memory, "nvidia.com/gpu": str(gpus), "pods": "110"},
            "conditions": [{"type": "MemoryPressure", "status": "False"},
                           {"type": "Ready", "status": ready, "reason": reason, "lastTransitionTime": stamp,
                            "lastHeartbeatTime": rfc3339(NOW)}],
        },
    }
