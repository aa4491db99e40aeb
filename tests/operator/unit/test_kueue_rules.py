"""kueue.rules: a DDPJob's Kueue Workload, what its status means for the gang, and what the operator writes back."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from ddp_contract import labels
from ddp_contract.timestamps import rfc3339
from ddp_operator import constants as c
from ddp_operator.conditions import get_condition
from ddp_operator.decision import Action, decide
from ddp_operator.kueue.rules import (
    ADMITTED,
    PRIORITY_CLASS_LABEL,
    QUEUE_LABEL,
    Gate,
    activation_patch,
    belongs_to,
    build_workload,
    can_judge,
    finish_patch,
    holds_quota,
    queue_name,
    queue_state,
    release_patch,
    workload_name,
)
from ddp_operator.listwatch import owning_job_key
from ddp_operator.manifests import build_data_worker_pod, build_pod
from ddp_operator.statuspatch import compute_status
from podfixtures import EARLIER, JOB, NOW, job_spec, pod, summary_of

UID = "0123456789"


def queued_job(queue: str | None = "team-a", priority: str | None = None, **spec: Any) -> dict[str, Any]:
    job_labels = {**({QUEUE_LABEL: queue} if queue else {}), **({PRIORITY_CLASS_LABEL: priority} if priority else {})}
    return {"metadata": {"name": JOB, "namespace": "ns", "uid": UID, "labels": job_labels},
            "spec": {"worldSize": 2, "image": "trainer:1", "entrypoint": "train:main", **spec}}


def condition(type_: str, status: bool, reason: str = "R", message: str = "") -> dict[str, Any]:
    return {"type": type_, "status": "True" if status else "False", "reason": reason, "message": message,
            "lastTransitionTime": rfc3339(EARLIER)}


def workload(*conditions: dict[str, Any], owner: str = UID) -> dict[str, Any]:
    return {"metadata": {"name": f"ddpjob-{JOB}-01234", "namespace": "ns", "resourceVersion": "42", "generation": 1,
                         "labels": {labels.LABEL_JOB_NAME: JOB},
                         "ownerReferences": [{"controller": True, "uid": owner}]},
            "status": {"conditions": list(conditions),
                       **({"admission": {"clusterQueue": "cq"}} if any(
                           x["type"] == "QuotaReserved" and x["status"] == "True" for x in conditions) else {})}}


ADMITTED_WORKLOAD = (condition("QuotaReserved", True, "QuotaReserved"), condition("Admitted", True, "Admitted"))


def test_only_a_job_with_the_queue_label_is_queued() -> None:
    assert queue_name(queued_job()) == "team-a"
    assert queue_name(queued_job(queue=None)) is None


def test_the_workload_asks_for_every_pod_of_the_gang_with_a_rank_pods_spec() -> None:
    job = queued_job(resources={"requests": {"cpu": "2"}}, gpusPerRank=2, worldSize=8, ranksPerPod=4)
    spec = job_spec(**{k: v for k, v in job["spec"].items() if k != "image"})
    pod_spec = build_pod(job, spec, 0, 0)["spec"]
    built = build_workload(job, spec, pod_spec=pod_spec)
    assert built["metadata"]["name"] == workload_name(job) == f"ddpjob-{JOB}-01234"
    assert built["metadata"]["labels"][labels.LABEL_JOB_NAME] == JOB
    assert built["spec"]["queueName"] == "team-a"
    (pod_set,) = built["spec"]["podSets"]
    assert pod_set["count"] == 2  # 8 ranks, 4 per pod
    trainer = pod_set["template"]["spec"]["containers"][0]
    assert trainer["resources"]["requests"] == {"cpu": "2", c.GPU_RESOURCE: 8}
    assert "priorityClassRef" not in built["spec"]
    assert owning_job_key(built) == ("ns", JOB)


def test_a_job_with_data_workers_asks_kueue_for_them_as_a_second_pod_set() -> None:
    job = queued_job(dataWorkers={"replicas": 3, "resources": {"requests": {"cpu": "4", "memory": "8Gi"}}})
    spec = job_spec(**{k: v for k, v in job["spec"].items() if k != "image"})
    workers = build_data_worker_pod(job, spec, 0)["spec"]
    ranks, data = build_workload(job, spec, pod_spec=build_pod(job, spec, 0, 0)["spec"], priority=None,
                                 data_worker_pod_spec=workers)["spec"]["podSets"]
    assert (ranks["name"], data["name"], data["count"]) == ("ranks", "data-workers", 3)
    assert data["template"]["spec"]["containers"][0]["resources"] == {"requests": {"cpu": "4", "memory": "8Gi"}}
    none_asked = build_workload(job, job_spec(), pod_spec={}, priority=None, data_worker_pod_spec=workers)
    assert len(none_asked["spec"]["podSets"]) == 1  # none in the spec


def test_the_workload_carries_the_priority_class_and_its_value() -> None:
    job = queued_job(priority="urgent")
    built = build_workload(job, job_spec(), pod_spec={}, priority=1000)
    assert built["spec"]["priority"] == 1000
    assert built["spec"]["priorityClassRef"] == {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass",
                                                 "name": "urgent"}


def test_a_workload_belongs_to_the_job_with_its_controller_uid() -> None:
    assert belongs_to(workload(), queued_job())
    assert not belongs_to(workload(owner="another"), queued_job())


def test_without_a_workload_the_gang_waits() -> None:
    state = queue_state(queued_job(), job_spec(), None)
    assert state.gate == Gate.QUEUED and state.reason == c.REASON_QUEUED
    assert "LocalQueue team-a" in state.message and "creating its Workload" in state.message


def test_a_pending_workload_waits_with_kueues_own_words() -> None:
    said = "couldn't assign flavors to pod set ranks: insufficient unused quota for cpu in flavor default, 1 more needed"
    state = queue_state(queued_job(), job_spec(), workload(condition("QuotaReserved", False, "Pending", said)))
    assert state.gate == Gate.QUEUED and state.reason == c.REASON_QUEUED
    assert state.message.endswith(f"Kueue: {said}") and "(2 pods)" in state.message


def test_quota_reserved_but_not_admitted_still_waits() -> None:
    state = queue_state(queued_job(), job_spec(), workload(condition("QuotaReserved", True)))
    assert state.gate == Gate.QUEUED and "admission checks" in state.message


def test_an_admitted_workload_opens_the_gate() -> None:
    assert queue_state(queued_job(), job_spec(), workload(*ADMITTED_WORKLOAD)) == ADMITTED


def test_an_evicted_workload_still_holding_quota_stops_the_gang() -> None:
    evicted = condition("Evicted", True, "Preempted", "Preempted to accommodate a workload (UID: x) due to prioritization")
    state = queue_state(queued_job(), job_spec(), workload(*ADMITTED_WORKLOAD, evicted))
    assert state.gate == Gate.EVICTED and state.reason == c.REASON_EVICTED
    assert "Preempted: Preempted to accommodate" in state.message


def test_an_evicted_workload_whose_quota_was_handed_back_waits_again() -> None:
    conditions = (condition("QuotaReserved", False, "Pending", "waiting"), condition("Evicted", True, "Preempted"))
    assert queue_state(queued_job(), job_spec(), workload(*conditions)).gate == Gate.QUEUED


def test_a_kueue_that_is_not_there_is_said_so() -> None:
    state = queue_state(queued_job(), job_spec(), None, unavailable="Kueue's Workload API is not served")
    assert state.gate == Gate.QUEUED and state.message.endswith("Kueue's Workload API is not served")


def test_a_job_is_judged_once_its_namespaces_workloads_are_listed_or_kueue_is_not_there() -> None:
    for started in (False, True):
        assert can_judge(None, None, started)
        assert can_judge("Kueue's Workload API is not served", 404, started)  # waits, saying so
        assert not can_judge("listing Kueue's Workloads", None, started)  # a view merely empty so far stops nothing
    refused = "Kueue's Workloads cannot be listed: 403 Forbidden"
    assert not can_judge(refused, 403, started=True)  # a running gang is not stopped on an empty view
    assert can_judge(refused, 403, started=False)  # a job that never ran waits, saying why


def test_release_after_eviction_clears_the_admission_and_requeues() -> None:
    evicted = condition("Evicted", True, "Preempted", "preempted by urgent")
    patch = release_patch(workload(*ADMITTED_WORKLOAD, evicted), NOW)
    assert patch is not None
    assert patch["metadata"] == {"resourceVersion": "42"}  # conditional: Kueue's own changes are not overwritten
    status = patch["status"]
    assert status["admission"] is None
    assert get_condition(status["conditions"], "QuotaReserved")["status"] == "False"
    assert get_condition(status["conditions"], "QuotaReserved")["reason"] == "Pending"
    assert get_condition(status["conditions"], "Admitted")["status"] == "False"
    requeued = get_condition(status["conditions"], "Requeued")
    assert (requeued["status"], requeued["reason"], requeued["message"]) == ("True", "Preempted", "preempted by urgent")
    assert get_condition(status["conditions"], "Evicted")["status"] == "True"  # Kueue's, left as it is


def test_nothing_is_released_from_an_admitted_workload_or_one_without_quota() -> None:
    assert release_patch(workload(*ADMITTED_WORKLOAD), NOW) is None
    assert release_patch(workload(condition("QuotaReserved", False), condition("Evicted", True)), NOW) is None


def test_a_suspended_jobs_workload_is_deactivated_and_activated_again_on_resume() -> None:
    job = queued_job()
    assert build_workload(job, job_spec(suspend=True), pod_spec={})["spec"]["active"] is False
    assert activation_patch(workload(), job_spec(suspend=True)) == {"spec": {"active": False}}
    assert activation_patch({**workload(), "spec": {"active": False}}, job_spec()) == {"spec": {"active": True}}
    assert activation_patch(workload(), job_spec()) is None


def test_a_deactivated_workload_hands_its_quota_back_without_requeueing() -> None:
    evicted = condition("Evicted", True, "Deactivated", "The workload is deactivated")
    patch = release_patch(workload(*ADMITTED_WORKLOAD, evicted), NOW)
    assert patch is not None and not holds_quota(patch)
    assert get_condition(patch["status"]["conditions"], "Requeued")["status"] == "False"


def test_a_finished_job_finishes_its_workload_once() -> None:
    patch = finish_patch(workload(*ADMITTED_WORKLOAD), True, "all 2 ranks exited 0", NOW)
    assert patch is not None and patch["status"]["admission"] is None
    finished = get_condition(patch["status"]["conditions"], "Finished")
    assert (finished["status"], finished["reason"], finished["message"]) == ("True", "Succeeded", "all 2 ranks exited 0")
    assert get_condition(patch["status"]["conditions"], "QuotaReserved")["reason"] == "Finished"
    done = workload(*patch["status"]["conditions"])
    assert finish_patch(done, True, "again", NOW + timedelta(seconds=1)) is None
    failed = finish_patch(workload(), False, "rank 1 failed", NOW)
    assert failed is not None and get_condition(failed["status"]["conditions"], "Finished")["reason"] == "Failed"


def test_a_queued_job_makes_no_pods_and_is_pending_without_a_start_time() -> None:
    spec = job_spec()
    state = queue_state(queued_job(), spec, None)
    decision = decide(spec, status={}, summary=summary_of(), now=NOW, queue=state)
    assert decision.action == Action.QUEUE and decision.create_indices == () and decision.reason == c.REASON_QUEUED
    status = compute_status(spec, status={}, summary=summary_of(), decision=decision, now=NOW)
    assert status["phase"] == c.PHASE_PENDING and status["reason"] == c.REASON_QUEUED
    assert status["startTime"] is None and status["message"] == state.message


def test_an_admitted_job_creates_its_gang() -> None:
    decision = decide(job_spec(), status={"phase": "Pending"}, summary=summary_of(), now=NOW, queue=ADMITTED)
    assert decision.action == Action.CREATE and decision.create_indices == (0, 1)


def test_an_evicted_gang_is_suspended_without_counting_a_restart() -> None:
    spec = job_spec()
    evicted = condition("Evicted", True, "Preempted", "preempted")
    state = queue_state(queued_job(), spec, workload(*ADMITTED_WORKLOAD, evicted))
    running = {"phase": "Running", "attempt": 0, "startTime": rfc3339(EARLIER)}
    decision = decide(spec, status=running, summary=summary_of(pod(0), pod(1)), now=NOW, queue=state)
    assert decision.action == Action.SUSPEND and decision.delete_pods == ("mnist-0", "mnist-1")
    status = compute_status(spec, status=running, summary=summary_of(pod(0), pod(1)), decision=decision, now=NOW)
    assert status["phase"] == c.PHASE_SUSPENDED and status["reason"] == c.REASON_EVICTED
    assert status["restarts"] == 0 and status["startTime"] is None
    # Its pods gone, the gang is not a lost rank: it waits in the queue again.
    after = decide(spec, status={**running, **status}, summary=summary_of(), now=NOW,
                   queue=queue_state(queued_job(), spec, workload()))
    assert after.action == Action.QUEUE


def test_a_finished_gang_succeeds_even_if_evicted_at_the_end() -> None:
    evicted = queue_state(queued_job(), job_spec(), workload(*ADMITTED_WORKLOAD, condition("Evicted", True)))
    decision = decide(job_spec(), status={"phase": "Running"}, summary=summary_of(pod(0, "succeeded"), pod(1, "succeeded")),
                      now=NOW, queue=evicted)
    assert decision.action == Action.SUCCEED


def test_a_job_with_a_topology_asks_kueue_for_it_with_the_pod_index_as_the_place() -> None:
    job = queued_job(topology={"preferred": "example.com/rack"})
    spec = job_spec(topology={"preferred": "example.com/rack"})
    (pod_set,) = build_workload(job, spec, pod_spec={})["spec"]["podSets"]
    assert pod_set["topologyRequest"] == {"preferred": "example.com/rack", "podIndexLabel": labels.LABEL_RANK}
    (plain,) = build_workload(job, job_spec(), pod_spec={})["spec"]["podSets"]
    assert "topologyRequest" not in plain
