"""MultiKueue, on both of its clusters, on a fake API: on the manager a job of spec.managedBy
kueue.x-k8s.io/multikueue gets its Workload and never a pod, and once dispatched its status is left to
MultiKueue; on the worker the copy adopts the Workload made for it beforehand instead of making one."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ddp_contract import api, labels
from ddp_operator import constants as c
from ddp_operator.kueue.multikueue import NEEDS_A_QUEUE, Role, role
from ddp_operator.kueue.rules import (
    ADMITTED,
    PREBUILT_WORKLOAD_KEY,
    QUEUE_LABEL,
    Gate,
    QueueState,
    adoption_patch,
    belongs_to,
    queue_state,
    workload_name,
)
from fakekube import KEY, FakeWorkloads, ddpjob, reconciler_for
from podfixtures import JOB, job_spec

QUEUED = QueueState(Gate.QUEUED, c.REASON_QUEUED, "waiting")


def admitted_workload(name: str, owner: str | None = "job-uid") -> dict[str, Any]:
    conditions = [{"type": kind, "status": "True", "reason": kind, "message": ""} for kind in ("QuotaReserved", "Admitted")]
    refs = [{"apiVersion": api.API_VERSION, "kind": api.KIND, "name": JOB, "uid": owner, "controller": True}] if owner else []
    return {"metadata": {"name": name, "namespace": KEY[0], "resourceVersion": "7", "labels": {labels.LABEL_JOB_NAME: JOB},
                         "ownerReferences": refs},
            "spec": {"active": True}, "status": {"conditions": conditions, "admission": {"clusterQueue": "cq"}}}


def multikueue_job(status: dict[str, Any] | None = None, queue: str | None = "team-a") -> dict[str, Any]:
    job = ddpjob(status, managedBy=api.MANAGED_BY_MULTIKUEUE)
    if queue:
        job["metadata"]["labels"][QUEUE_LABEL] = queue
    return job


def run(reconciler: Any, creation: bool = True) -> None:
    asyncio.run(reconciler.reconcile(KEY))
    if creation:
        asyncio.run(reconciler.create_children(KEY))


@pytest.mark.parametrize(("managed_by", "queue", "phase", "expected"), [
    (api.MANAGED_BY_OPERATOR, None, None, Role.RUN),
    (api.MANAGED_BY_OPERATOR, ADMITTED, c.PHASE_RUNNING, Role.RUN),
    ("example.com/scheduler", QUEUED, None, Role.ELSEWHERE),
    (api.MANAGED_BY_MULTIKUEUE, QUEUED, c.PHASE_PENDING, Role.QUEUE),
    (api.MANAGED_BY_MULTIKUEUE, NEEDS_A_QUEUE, None, Role.QUEUE),
    (api.MANAGED_BY_MULTIKUEUE, ADMITTED, c.PHASE_PENDING, Role.DISPATCHED),
    (api.MANAGED_BY_MULTIKUEUE, QueueState(Gate.EVICTED), c.PHASE_RUNNING, Role.DISPATCHED),
    (api.MANAGED_BY_MULTIKUEUE, None, c.PHASE_SUCCEEDED, Role.DISPATCHED),
])
def test_the_role_follows_managed_by_and_the_workload(managed_by: str, queue: QueueState | None, phase: str | None,
                                                       expected: Role) -> None:
    assert role(managed_by, queue, phase) == expected


def test_the_manager_makes_the_workload_and_says_the_job_waits_and_makes_no_pod() -> None:
    reconciler, kube, _ = reconciler_for(multikueue_job(), FakeWorkloads())
    run(reconciler)
    assert kube.created("Workload") == [f"ddpjob-{JOB}-job-u"]
    assert kube.status_patches[-1]["phase"] == c.PHASE_PENDING and kube.status_patches[-1]["reason"] == c.REASON_QUEUED
    assert kube.created("Pod") == [] and kube.created("Service") == []


def test_once_dispatched_the_manager_writes_no_status_and_makes_no_pod() -> None:
    workloads = FakeWorkloads()
    workloads.by_job[KEY] = [admitted_workload(f"ddpjob-{JOB}-job-u")]
    copied = {"phase": c.PHASE_RUNNING, "readyRanks": 2, "startTime": "2026-11-30T12:00:00Z"}  # MultiKueue's copy
    reconciler, kube, _ = reconciler_for(multikueue_job(copied), workloads)
    run(reconciler)
    assert kube.status_patches == [] and kube.created("Pod") == [] and kube.created("Workload") == []

    reconciler.jobs.put(multikueue_job({**copied, "phase": c.PHASE_SUCCEEDED}))
    run(reconciler)
    assert kube.status_patches == []
    finished = [patch for _, patch, of_status in kube.workload_patches if of_status]
    assert any(x["type"] == "Finished" for x in finished[-1]["status"]["conditions"])


def test_a_multikueue_job_without_a_queue_waits_saying_what_it_needs() -> None:
    reconciler, kube, _ = reconciler_for(multikueue_job(queue=None), FakeWorkloads())
    run(reconciler)
    said = kube.status_patches[-1]
    assert said["reason"] == c.REASON_QUEUED and QUEUE_LABEL in said["message"] and "MultiKueue" in said["message"]
    assert kube.created("Pod") == [] and kube.created("Workload") == []


def test_another_controllers_job_is_left_alone() -> None:
    reconciler, kube, _ = reconciler_for(ddpjob(managedBy="example.com/scheduler"), FakeWorkloads())
    run(reconciler)
    assert kube.status_patches == [] and kube.calls == []


def worker_copy(by_label: bool = False) -> dict[str, Any]:
    """MultiKueue's copy of a job: no managedBy, the prebuilt Workload named (by Kueue 0.18 on in an
    annotation, before in a label)."""
    job = ddpjob()
    job["metadata"]["labels"][QUEUE_LABEL] = "team-a"
    job["metadata"]["labels" if by_label else "annotations"] = {
        **job["metadata"].get("labels" if by_label else "annotations", {}), PREBUILT_WORKLOAD_KEY: "wl-from-manager"}
    return job


def test_the_worker_adopts_the_prebuilt_workload_and_runs_the_gang_it_admits() -> None:
    workloads = FakeWorkloads()
    workloads.by_job[KEY] = [admitted_workload("wl-from-manager", owner=None)]
    reconciler, kube, _ = reconciler_for(worker_copy(), workloads)
    run(reconciler)
    assert kube.created("Workload") == []
    (name, patch, of_status), = kube.workload_patches
    assert name == "wl-from-manager" and not of_status
    assert patch["metadata"]["ownerReferences"][0]["uid"] == "job-uid"
    assert patch["metadata"]["resourceVersion"] == "7"  # adopted only as seen, or refused (409)
    assert kube.created("Pod") == [f"{JOB}-0", f"{JOB}-1"]


def test_the_worker_waits_for_a_prebuilt_workload_not_listed_yet_and_makes_none() -> None:
    reconciler, kube, _ = reconciler_for(worker_copy(), FakeWorkloads())
    run(reconciler)
    assert kube.created("Workload") == [] and kube.created("Pod") == []
    assert "wl-from-manager" in kube.status_patches[-1]["message"]


@pytest.mark.parametrize("by_label", [False, True])
def test_a_prebuilt_workload_is_the_jobs_only_while_nothing_else_controls_it(by_label: bool) -> None:
    job = worker_copy(by_label)
    assert workload_name(job) == "wl-from-manager"
    assert belongs_to(admitted_workload("wl-from-manager", owner=None), job)
    assert belongs_to(admitted_workload("wl-from-manager"), job)
    assert not belongs_to(admitted_workload("wl-from-manager", owner="someone-else"), job)
    assert not belongs_to(admitted_workload("another", owner=None), job)
    assert adoption_patch(admitted_workload("wl-from-manager"), job) is None
    assert "listed" in queue_state(job, job_spec(), None).message
