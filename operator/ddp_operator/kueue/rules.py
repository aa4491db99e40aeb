"""Kueue: a DDPJob labelled with a LocalQueue runs only while Kueue admits its whole gang.

The operator integrates the way Kueue's own job integrations do, from outside Kueue: for a queued
job it creates a Workload (a pod set of the job's pods, each with rank 0's pod spec, so its
resources, nodeSelector, tolerations and affinity; and one of its data workers) owned by the job, and keeps the job without pods
until Kueue admits that Workload. When Kueue evicts it (preemption by a higher priority, a stopped
queue) the pods are deleted and, once they are gone, the quota is handed back (the Workload's
admission cleared, as Kueue's job reconciler does), so Kueue queues it again; on re-admission the
gang is created afresh and resumes from status.lastCheckpoint. A finished job marks its Workload
Finished, which frees the quota. A suspended job's Workload is deactivated (spec.active false), so
Kueue evicts it if admitted and admits it no more until the job is resumed.

MultiKueue (multikueue.py says what the operator does on either side): on the worker cluster, the job
MultiKueue creates names its Workload, made beforehand, in the annotation (before Kueue 0.18, the label)
kueue.x-k8s.io/prebuilt-workload-name;
the operator adopts that Workload (makes the job its controlling owner, as Kueue's integrations do) and
never creates one of its own for such a job.

Everything here is pure: what the Workload looks like, what its status means for the job, and the
status patches the operator writes to it; gate.py carries it out, workloads.py watches the Workloads.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ddp_contract import labels
from ddp_contract.jobspec import JobSpec
from ddp_operator import constants as c
from ddp_operator.conditions import get_condition, set_condition
from ddp_operator.kubeapi import is_controlled_by, owner_reference
from ddp_operator.manifests import job_labels

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
# An annotation from Kueue 0.18 on (its WorkloadIdentifierAnnotations gate), a label before.
PREBUILT_WORKLOAD_KEY = "kueue.x-k8s.io/prebuilt-workload-name"
KUEUE_GROUP = "kueue.x-k8s.io"
# v1beta2: the version Kueue stores from 0.16 on (read without its conversion webhook), served from 0.15.
KUEUE_VERSION = "v1beta2"
WORKLOADS = "workloads"
PRIORITY_CLASSES = "workloadpriorityclasses"
RESOURCE_FLAVORS = "resourceflavors"
POD_SET = "ranks"
DATA_WORKER_POD_SET = "data-workers"
# Workload condition types and reasons, as Kueue writes them.
COND_QUOTA_RESERVED = "QuotaReserved"
COND_ADMITTED = "Admitted"
COND_EVICTED = "Evicted"
COND_REQUEUED = "Requeued"
COND_FINISHED = "Finished"
# Evictions after which Kueue's own integrations mark the Workload Requeued=True.
REQUEUED_EVICTIONS = frozenset({"Preempted", "NodeFailures"})


class Gate(enum.StrEnum):
    UNKNOWN = "Unknown"  # the Workload watch has not listed yet: nothing is judged or done
    ADMITTED = "Admitted"  # the gang may run
    QUEUED = "Queued"  # waiting for admission: no pods
    EVICTED = "Evicted"  # admitted, then evicted: the pods go, then the quota is handed back


@dataclass(frozen=True)
class QueueState:
    gate: Gate
    reason: str = ""  # the job's status reason while the gate is closed
    message: str = ""


ADMITTED = QueueState(Gate.ADMITTED)
UNKNOWN = QueueState(Gate.UNKNOWN)


def queue_name(job: Mapping[str, Any]) -> str | None:
    """The LocalQueue the job names, if any: only such jobs wait for Kueue."""
    value = ((job.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL)
    return str(value) if value else None


def priority_class(job: Mapping[str, Any]) -> str | None:
    value = ((job.get("metadata") or {}).get("labels") or {}).get(PRIORITY_CLASS_LABEL)
    return str(value) if value else None


def prebuilt_workload(job: Mapping[str, Any]) -> str | None:
    """The Workload made for the job beforehand (by MultiKueue, on a worker cluster), if the job names one:
    its annotation first, then its label, as Kueue reads them."""
    meta = job.get("metadata") or {}
    value = (meta.get("annotations") or {}).get(PREBUILT_WORKLOAD_KEY) or (meta.get("labels") or {}).get(PREBUILT_WORKLOAD_KEY)
    return str(value) if value else None


def workload_name(job: Mapping[str, Any]) -> str:
    """The prebuilt Workload's name, else 'ddpjob-<job>-<uid prefix>': a job deleted and created again
    under its name gets a new Workload."""
    prebuilt = prebuilt_workload(job)
    if prebuilt:
        return prebuilt
    meta = job["metadata"]
    return f"ddpjob-{meta['name']}-{str(meta.get('uid', ''))[:5]}"


def build_workload(job: Mapping[str, Any], spec: JobSpec, *, pod_spec: Mapping[str, Any],
                   priority: int | None = None, data_worker_pod_spec: Mapping[str, Any] | None = None
                   ) -> dict[str, Any]:
    """The job's Workload: a pod set of spec.all_pods pods (the gang's and its spares), each with the
    given (rank 0's) pod spec, and with spec.dataWorkers one of its data workers (data_worker_pod_spec),
    so the quota Kueue admits the job into holds both, as a namespace ResourceQuota counts both.

    ownerReferences are added by the caller; the Workload goes with its job.
    """
    meta = job["metadata"]
    pod_sets: list[dict[str, Any]] = [{"name": POD_SET, "count": spec.all_pods, "template": {"spec": dict(pod_spec)}}]
    if spec.topology is not None:
        # Kueue's topology-aware scheduling: pod i's place in the assignment is its index.
        pod_sets[0]["topologyRequest"] = {"required" if spec.topology.required else "preferred": spec.topology.key,
                                          "podIndexLabel": labels.LABEL_RANK}
    if spec.data_worker_replicas and data_worker_pod_spec is not None:
        pod_sets.append({"name": DATA_WORKER_POD_SET, "count": spec.data_worker_replicas,
                         "template": {"spec": dict(data_worker_pod_spec)}})
    workload_spec: dict[str, Any] = {
        "active": not spec.suspend,
        "queueName": queue_name(job),
        "podSets": pod_sets,
    }
    name = priority_class(job)
    if name:
        workload_spec.update(priority=priority or 0, priorityClassRef={
            "group": KUEUE_GROUP, "kind": "WorkloadPriorityClass", "name": name})
    return {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
        "kind": "Workload",
        "metadata": {"name": workload_name(job), "namespace": meta["namespace"], "labels": job_labels(meta["name"])},
        "spec": workload_spec,
    }


def belongs_to(workload: Mapping[str, Any], job: Mapping[str, Any]) -> bool:
    """Whether the Workload is the job's: the job (this uid) controls it, or it is the job's prebuilt
    Workload and nothing controls it yet (adoption_patch makes the job its controller)."""
    meta = workload.get("metadata") or {}
    if is_controlled_by(meta, job):
        return True
    prebuilt = prebuilt_workload(job)
    refs = meta.get("ownerReferences") or []
    return prebuilt is not None and meta.get("name") == prebuilt and not any(ref.get("controller") for ref in refs)


def adoption_patch(workload: Mapping[str, Any], job: Mapping[str, Any]) -> dict[str, Any] | None:
    """The metadata patch that makes the job the controller of its prebuilt Workload, so that the
    Workload goes with the job; None once it is."""
    meta = workload.get("metadata") or {}
    if is_controlled_by(meta, job):
        return None
    return {"metadata": {"ownerReferences": [*(meta.get("ownerReferences") or []), owner_reference(job)],
                         "resourceVersion": meta.get("resourceVersion")}}


def _true(conditions: Iterable[Mapping[str, Any]], type_: str) -> Mapping[str, Any] | None:
    found = get_condition(conditions, type_)
    return found if found is not None and found.get("status") == "True" else None


def queue_state(job: Mapping[str, Any], spec: JobSpec, workload: Mapping[str, Any] | None,
                unavailable: str | None = None) -> QueueState:
    """What the job's Workload (None: not created yet) says the gang may do.

    unavailable: why the operator cannot see Workloads at all (Kueue not installed), if so.
    """
    queue = queue_name(job)
    waiting = f"waiting in LocalQueue {queue} for Kueue to admit the gang ({spec.all_pods} pods)"
    if unavailable:
        return QueueState(Gate.QUEUED, c.REASON_QUEUED, f"{waiting}; {unavailable}")
    if workload is None:
        if prebuilt_workload(job):
            return QueueState(Gate.QUEUED, c.REASON_QUEUED,
                              f"{waiting}; waiting for its Workload {workload_name(job)}, made beforehand ("
                              f"{PREBUILT_WORKLOAD_KEY}), to be listed")
        return QueueState(Gate.QUEUED, c.REASON_QUEUED, f"{waiting}; creating its Workload {workload_name(job)}")
    conditions = (workload.get("status") or {}).get("conditions") or []
    evicted = _true(conditions, COND_EVICTED)
    reserved = _true(conditions, COND_QUOTA_RESERVED)
    if evicted is not None and reserved is not None:
        why = evicted.get("reason") or "Evicted"
        return QueueState(Gate.EVICTED, c.REASON_EVICTED,
                          f"Kueue evicted the gang ({why}: {evicted.get('message', '')}); its pods are deleted "
                          f"and it waits in LocalQueue {queue} to be admitted again")
    if _true(conditions, COND_ADMITTED) is not None:
        return ADMITTED
    if reserved is not None:
        return QueueState(Gate.QUEUED, c.REASON_QUEUED,
                          f"{waiting}; quota is reserved, its admission checks are pending")
    pending = get_condition(conditions, COND_QUOTA_RESERVED)
    said = (pending or {}).get("message") or "not considered yet"
    return QueueState(Gate.QUEUED, c.REASON_QUEUED, f"{waiting}; Kueue: {said}")


def can_judge(unavailable: str | None, error_status: int | None, started: bool) -> bool:
    """Whether a queued job may be judged on the Workload watch's view of its namespace: once the
    watch has listed, or when Kueue's API is not served at all (404: the job waits, its status saying
    so). Not while the watch is still listing, nor when refused for a job that has started: a running
    gang is not stopped on a view that is merely empty. A job that never started has nothing to stop:
    refused, it waits and says why."""
    return not unavailable or error_status == 404 or (error_status is not None and not started)


def holds_quota(workload: Mapping[str, Any] | None) -> bool:
    conditions = ((workload or {}).get("status") or {}).get("conditions") or []
    return _true(conditions, COND_QUOTA_RESERVED) is not None


def is_finished(workload: Mapping[str, Any] | None) -> bool:
    conditions = ((workload or {}).get("status") or {}).get("conditions") or []
    return _true(conditions, COND_FINISHED) is not None


def is_active(workload: Mapping[str, Any]) -> bool:
    return bool((workload.get("spec") or {}).get("active", True))


def activation_patch(workload: Mapping[str, Any], spec: JobSpec) -> dict[str, Any] | None:
    """The Workload spec patch that deactivates it while the job is suspended, and activates it
    again on resume; None when it is as it should be."""
    active = not spec.suspend
    return None if is_active(workload) == active else {"spec": {"active": active}}


def release_patch(workload: Mapping[str, Any], now: datetime) -> dict[str, Any] | None:
    """The Workload status patch that hands its quota back once an evicted gang's pods are gone, as
    Kueue's job integrations do (Requeued as they set it); Kueue then queues it again. None when it
    holds no quota or was not evicted."""
    status = workload.get("status") or {}
    conditions = status.get("conditions") or []
    evicted = _true(conditions, COND_EVICTED)
    if not holds_quota(workload) or evicted is None:
        return None
    reason, message = str(evicted.get("reason") or "Evicted"), str(evicted.get("message") or "")
    generation = (workload.get("metadata") or {}).get("generation")
    conditions = set_condition(conditions, COND_REQUEUED, status=reason in REQUEUED_EVICTIONS, reason=reason, message=message,
                               now=now, generation=generation)
    return _without_quota(workload, conditions=conditions, reason="Pending", message=message, now=now)


def finish_patch(workload: Mapping[str, Any], succeeded: bool, message: str, now: datetime) -> dict[str, Any] | None:
    """The Workload status patch for a finished job (Finished; the quota handed back); None if it is marked so."""
    if is_finished(workload):
        return None
    generation = (workload.get("metadata") or {}).get("generation")
    conditions = set_condition((workload.get("status") or {}).get("conditions") or [], COND_FINISHED, status=True,
                               reason="Succeeded" if succeeded else "Failed", message=message, now=now, generation=generation)
    return _without_quota(workload, conditions=conditions, reason=COND_FINISHED, message="Workload has finished", now=now)


def _without_quota(workload: Mapping[str, Any], *, conditions: list[dict[str, Any]], reason: str, message: str,
                   now: datetime) -> dict[str, Any]:
    """A merge patch: no admission, QuotaReserved and Admitted False; conditional on the Workload's
    resourceVersion, so a change Kueue made meanwhile makes it fail (409) instead of being overwritten."""
    meta = workload.get("metadata") or {}
    generation = meta.get("generation")
    conditions = set_condition(conditions, COND_QUOTA_RESERVED, status=False, reason=reason, message=message, now=now,
                               generation=generation)
    admitted_reason = COND_FINISHED if reason == COND_FINISHED else "NoReservation"
    admitted_message = message if reason == COND_FINISHED else "The workload has no reservation"
    if get_condition(conditions, COND_ADMITTED) is not None:
        conditions = set_condition(conditions, COND_ADMITTED, status=False, reason=admitted_reason, message=admitted_message,
                                   now=now, generation=generation)
    return {"metadata": {"resourceVersion": meta.get("resourceVersion")},
            "status": {"admission": None, "conditions": conditions}}
