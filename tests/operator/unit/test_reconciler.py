"""What a status pass and a creation pass do, on a fake API: status before action, one status writer,
deletes by uid and not twice, count-only patches held back, refusals said by the next status pass,
a quota too small for the gang creating nothing and waiting."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from dataclasses import replace
from typing import Any, TypeVar

import pytest

from ddp_operator import constants as c
from ddp_operator import creation as creation_module
from ddp_operator import reconciler as reconciler_module
from ddp_operator import timers
from ddp_operator.admission import RETRY_FIRST
from ddp_operator.jobmemory import UNSEEN_WAIT
from ddp_operator.nodes import NodeInfo, Nodes
from ddp_operator.passerrors import RetryLater
from fakekube import KEY, ddpjob, rank_of, reconciler_for, refusal
from podfixtures import pod

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


class Clock:
    """The reconciler's monotonic clock, moved by the test."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_new_job_s_status_pass_records_status_and_leaves_creation_to_the_creation_pass() -> None:
    reconciler, kube, _ = reconciler_for(ddpjob())
    run(reconciler.reconcile(KEY))
    assert kube.status_patches[0]["phase"] == c.PHASE_PENDING and kube.created("Pod") == []
    assert reconciler.creations.pending() == {KEY}  # handed over, not awaited

    patches = len(kube.status_patches)
    run(reconciler.create_children(KEY))
    assert kube.created("Service") == ["mnist"] and kube.created("Pod") == ["mnist-0", "mnist-1"]
    assert kube.created("Role") == ["mnist-progress"] and kube.created("RoleBinding") == ["mnist-progress"]
    assert len(kube.status_patches) == patches  # the creation pass writes no status
    assert {rank_of(kube.objects[("Pod", f"mnist-{r}")]) for r in (0, 1)} == {0, 1}


def test_a_creation_pass_creates_nothing_for_an_attempt_the_status_has_not_recorded() -> None:
    reconciler, kube, pods = reconciler_for(ddpjob({"phase": "Restarting", "attempt": 1}))
    pods.set(ddpjob(), [pod(0, "running", attempt=0), pod(1, "failed", attempt=0, exit_code=1)])
    run(reconciler.create_children(KEY))  # it decides Restart (attempt 2): not its to act on
    assert kube.created("Pod") == []


def test_deletes_carry_the_uid_and_are_not_issued_twice_until_the_reissue_time() -> None:
    job = ddpjob({"phase": "Running", "attempt": 0, "startTime": "2025-01-02T03:00:00Z"})
    reconciler, kube, pods = reconciler_for(job)
    reconciler.clock = clock = Clock()
    pods.set(job, [pod(0, "running"), pod(1, "failed", exit_code=1)])
    run(reconciler.reconcile(KEY))  # a gang restart: both pods go, each by the uid the pass saw
    assert sorted(kube.deleted()) == [("mnist-0", "uid-0-0", False), ("mnist-1", "uid-1-0", False)]

    reconciler.jobs.put(ddpjob({"phase": "Restarting", "attempt": 1}))
    run(reconciler.reconcile(KEY))  # the pod watch has not seen them go yet: not deleted again
    assert len(kube.deleted()) == 2
    clock.now += reconciler_module.DELETE_REISSUE_AFTER + 1
    run(reconciler.reconcile(KEY))  # still there after the reissue time: asked again
    assert len(kube.deleted()) == 4


def test_a_patch_of_rank_counts_alone_waits_out_the_counts_interval() -> None:
    job = ddpjob({"phase": "Starting", "attempt": 0}, worldSize=3)
    reconciler, kube, pods = reconciler_for(job)
    reconciler.clock = clock = Clock()
    pods.set(job, [pod(0, "running"), pod(1, "running", ready=False), pod(2, "running", ready=False)])
    run(reconciler.reconcile(KEY))
    first = len(kube.status_patches)
    reconciler.jobs.put({**job, "status": {**job["status"], **kube.status_patches[-1]}})

    clock.now += 0.25
    pods.set(job, [pod(0, "running"), pod(1, "running"), pod(2, "running", ready=False)])  # 1/3 -> 2/3 ready only
    wait = run(reconciler.reconcile(KEY))
    assert len(kube.status_patches) == first and wait == pytest.approx(timers.COUNTS_INTERVAL - 0.25)

    pods.set(job, [pod(0, "running"), pod(1, "running"), pod(2, "running")])  # every rank ready: Running, a phase change
    run(reconciler.reconcile(KEY))
    assert kube.status_patches[-1]["phase"] == c.PHASE_RUNNING


def test_a_pod_refused_by_pod_security_fails_the_job_in_the_next_status_pass() -> None:
    reconciler, kube, _ = reconciler_for(ddpjob())
    said = 'pods "mnist-{}" is forbidden: violates PodSecurity "restricted:latest": runAsUser=0 (pod must not set runAsUser=0)'
    kube.refuse = {("Pod", f"mnist-{r}"): refusal(403, said.format(r)) for r in (0, 1)}
    run(reconciler.reconcile(KEY))
    patches = len(kube.status_patches)
    run(reconciler.create_children(KEY))
    assert len(kube.status_patches) == patches and reconciler.queue.pending() == {KEY}  # noted; a status pass asked for

    reconciler.jobs.put({**ddpjob(), "status": kube.status_patches[-1]})
    run(reconciler.reconcile(KEY))
    last = kube.status_patches[-1]
    assert (last["phase"], last["reason"]) == (c.PHASE_FAILED, c.REASON_POD_SECURITY)
    assert last["message"] == ('ranks 0-1 (PodSecurity): the API server refused the pod: violates PodSecurity '
                               '"restricted:latest": runAsUser=0 (pod must not set runAsUser=0)')
    assert [(e["type"], e["reason"]) for e in kube.events][-1] == ("Warning", c.REASON_POD_SECURITY)


def test_a_quota_that_cannot_hold_the_gang_creates_none_of_it_and_defers_the_next_try(monkeypatch) -> None:
    reconciler, kube, _ = reconciler_for(ddpjob())
    reconciler.clock = clock = Clock()
    handed: list[tuple[str, str]] = []
    monkeypatch.setattr(reconciler.creations, "add", handed.append)  # the creation passes the status passes ask for
    kube.quotas = [{"metadata": {"name": "team"}, "spec": {"hard": {"pods": "1"}},
                    "status": {"hard": {"pods": "1"}, "used": {"pods": "0"}}}]
    run(reconciler.reconcile(KEY))
    run(reconciler.create_children(KEY))
    assert kube.created("Pod") == [] and kube.created("Service") == ["mnist"] and handed == [KEY]

    reconciler.jobs.put({**ddpjob(), "status": kube.status_patches[-1]})
    handed.clear()
    wait = run(reconciler.reconcile(KEY))
    assert kube.status_patches[-1]["reason"] == c.REASON_QUOTA_EXCEEDED
    assert "ranks 0-1 (QuotaExceeded): ResourceQuota team cannot hold the whole gang" in kube.status_patches[-1]["message"]
    assert handed == [] and wait == pytest.approx(5.0)  # the first retry's pause

    clock.now += 5.0
    run(reconciler.reconcile(KEY))
    assert handed == [KEY]  # tried again


def test_a_kueue_job_is_not_checked_against_namespace_quotas() -> None:
    reconciler, kube, _ = reconciler_for(ddpjob())
    job = ddpjob()
    job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team"}
    run(reconciler.create.gang(job, reconciler_module.parse_spec(job["spec"]), (0, 1), 0))
    assert ("list", "ResourceQuota") not in kube.calls and kube.created("Pod") == ["mnist-0", "mnist-1"]


def test_the_quota_is_read_once_an_attempt_before_its_first_pod() -> None:
    job = ddpjob({"phase": "Restarting", "attempt": 1}, worldSize=3)
    reconciler, kube, pods = reconciler_for(job)
    pods.set(job, [pod(0, "running", attempt=1)])  # the attempt's first pass has been: rank 0 exists
    run(reconciler.create_children(KEY))
    assert kube.created("Pod") == ["mnist-1", "mnist-2"] and ("list", "ResourceQuota") not in kube.calls


def test_an_elastic_job_s_ranks_left_out_are_judged_again_by_the_quota_that_holds_them() -> None:
    job = ddpjob({"phase": "Running", "attempt": 0}, worldSize=4, minWorldSize=2, gpusPerRank=1,
                 restartStrategy="InPlace")
    reconciler, kube, _ = reconciler_for(job)
    kube.quotas = [{"metadata": {"name": "gpus"}, "spec": {"hard": {"requests.nvidia.com/gpu": "2"}},
                    "status": {"hard": {"requests.nvidia.com/gpu": "2"}, "used": {"requests.nvidia.com/gpu": "2"}}}]
    spec = reconciler_module.parse_spec(job["spec"])
    run(reconciler.create.gang(job, spec, (2, 3), 0, live=2))
    said = reconciler.create.memory(KEY).refused
    assert kube.created("Pod") == [] and said is not None and said.ranks == (2, 3)
    assert said.refusal.reason == c.REASON_QUOTA_EXCEEDED
    assert said.refusal.message.startswith("ResourceQuota gpus cannot hold the whole gang, so only 2 of its pods are "
                                           "created (spec.minWorldSize): its other 2 pods need "
                                           "requests.nvidia.com/gpu=2 with 2 used of 2"), said.refusal.message

    kube.quotas[0]["status"] = {"hard": {"requests.nvidia.com/gpu": "3"}, "used": {"requests.nvidia.com/gpu": "2"}}
    run(reconciler.create.gang(job, spec, (2, 3), 0, live=2))  # room for one more: rank 2 joins
    said = reconciler.create.memory(KEY).refused
    assert kube.created("Pod") == ["mnist-2"] and said is not None and said.ranks == (3,)
    assert "so only 3 of its pods are created" in said.refusal.message


def test_a_name_held_by_another_owner_holds_the_ranks_up_as_name_in_use() -> None:
    reconciler, kube, _ = reconciler_for(ddpjob())
    kube.objects[("Service", "mnist")] = {"metadata": {"name": "mnist", "ownerReferences": []}}
    run(reconciler.create_children(KEY))
    assert kube.created("Pod") == []  # without its Service no rank is created
    run(reconciler.reconcile(KEY))
    assert kube.status_patches[-1]["reason"] == c.REASON_NAME_IN_USE
    assert "Service mnist exists and is not this job's" in kube.status_patches[-1]["message"]


def test_a_finished_job_past_its_ttl_is_deleted() -> None:
    job = ddpjob({"phase": "Succeeded", "completionTime": "2025-01-02T03:00:00Z"}, ttlSecondsAfterFinished=0)
    reconciler, kube, _ = reconciler_for(job)
    assert run(reconciler.reconcile(KEY)) is None and kube.calls == [("delete-job", "mnist")]


def test_a_spec_the_operator_cannot_use_fails_the_job_naming_the_field() -> None:
    reconciler, kube, _ = reconciler_for(ddpjob(worldSize=0))
    run(reconciler.reconcile(KEY))
    assert kube.status_patches[-1]["reason"] == c.REASON_INVALID_SPEC and "worldSize" in kube.status_patches[-1]["message"]
    run(reconciler.create_children(KEY))
    assert kube.created("Pod") == []


def test_a_rank_whose_pod_vanished_is_recorded_with_its_attempt_and_the_node_it_was_seen_on() -> None:
    job = ddpjob({"phase": "Running", "attempt": 2, "startTime": "2025-01-02T03:00:00Z"})
    reconciler, kube, pods = reconciler_for(job)
    pods.set(job, [pod(0, "running", attempt=2, node="gpu-a"), pod(1, "running", attempt=2, node="gpu-b")])
    run(reconciler.reconcile(KEY))
    pods.set(job, [pod(0, "running", attempt=2, node="gpu-a")])  # rank 1's pod is gone, node and all
    run(reconciler.reconcile(KEY))
    failed = kube.status_patches[-1]["failedRank"]
    assert (failed["reason"], failed["pod"], failed["attempt"], failed["node"]) == (
        c.REASON_RANK_MISSING, "mnist-1", 2, "gpu-b")


def overflowing(*_: Any, **__: Any) -> Any:
    """A decision that fails as the deadline arithmetic did on a deadline past the calendar's end."""
    raise OverflowError("date value out of range")


def test_a_status_pass_that_raises_says_why_on_the_job_once_and_logs_its_traceback_once(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    reconciler, kube, _ = reconciler_for(ddpjob())
    monkeypatch.setattr(reconciler_module, "decide", overflowing)
    for _ in range(3):
        with pytest.raises(RetryLater) as failed:
            run(reconciler.reconcile(KEY))
        assert failed.value.level == logging.DEBUG  # said already: the queue's line is quiet
    said = kube.status_patches
    assert len(said) == 1 and said[0]["phase"] == c.PHASE_PENDING and said[0]["reason"] == c.REASON_RECONCILE_ERROR
    assert said[0]["message"].startswith("the operator's status pass failed on this job: OverflowError: date value "
                                         "out of range (reconciler.py:")
    assert [(e["type"], e["reason"], e["message"]) for e in kube.events] == [
        ("Warning", c.REASON_RECONCILE_ERROR, said[0]["message"])]
    assert len([r for r in caplog.records if r.exc_info is not None]) == 1

    monkeypatch.undo()  # the cause is gone: the next pass writes the job's own status again
    run(reconciler.reconcile(KEY))
    assert kube.status_patches[-1]["reason"] == c.REASON_WAITING


def test_an_api_server_error_in_a_status_pass_is_retried_and_not_said_on_the_job(
        monkeypatch: pytest.MonkeyPatch) -> None:
    reconciler, kube, _ = reconciler_for(ddpjob())

    async def unavailable(*_: Any) -> Any:
        raise refusal(503, "the server is currently unable to handle the request")

    monkeypatch.setattr(kube, "patch_job_status", unavailable)
    with pytest.raises(RetryLater) as failed:
        run(reconciler.reconcile(KEY))
    assert failed.value.level == logging.WARNING and "503 the server is currently unable" in str(failed.value)
    assert kube.events == []


def test_a_creation_pass_that_raises_holds_the_ranks_up_said_by_the_status_pass_and_tries_again_later(
        monkeypatch: pytest.MonkeyPatch) -> None:
    reconciler, kube, _ = reconciler_for(ddpjob())
    handed: list[tuple[str, str]] = []
    monkeypatch.setattr(reconciler.creations, "add", handed.append)
    run(reconciler.reconcile(KEY))
    monkeypatch.setattr(creation_module, "build_pod", overflowing)
    run(reconciler.create_children(KEY))
    assert kube.created("Pod") == [] and handed == [KEY]
    wait = run(reconciler.reconcile(KEY))
    status = kube.status_patches[-1]
    assert status["reason"] == c.REASON_RECONCILE_ERROR and "creation pass failed on this job" in status["message"]
    blocked = next(x for x in status["conditions"] if x["type"] == c.COND_RANKS_BLOCKED)
    assert blocked["status"] == "True" and blocked["reason"] == c.REASON_RECONCILE_ERROR
    assert handed == [KEY] and wait == pytest.approx(RETRY_FIRST, abs=0.5), "the next try waits, as after a quota's refusal"
    assert [e["reason"] for e in kube.events if e["type"] == "Warning"] == [c.REASON_RECONCILE_ERROR]


def test_a_topology_job_s_pods_go_to_one_rack_and_wait_saying_so_while_the_nodes_are_not_listed() -> None:
    rack = "example.com/rack"
    job = ddpjob(topology={"required": rack}, resources={"requests": {"cpu": "4"}})
    reconciler, kube, _ = reconciler_for(job)
    racks = {"a1": "a", "b1": "b", "b2": "b"}
    nodes = Nodes({name: NodeInfo(name, ready="True", labels={rack: value}, allocatable={"cpu": "4", "pods": "10"})
                   for name, value in racks.items()}, synced=False)
    reconciler.nodes = lambda: nodes
    run(reconciler.reconcile(KEY))
    run(reconciler.create_children(KEY))
    assert kube.created("Pod") == []  # where the gang fits is not known yet
    reconciler.jobs.put({**job, "status": kube.status_patches[-1]})
    run(reconciler.reconcile(KEY))
    assert kube.status_patches[-1]["reason"] == c.REASON_NO_TOPOLOGY_DOMAIN
    assert "has not listed the nodes yet" in kube.status_patches[-1]["message"]

    nodes = replace(nodes, synced=True)
    run(reconciler.create_children(KEY))
    assert kube.created("Pod") == ["mnist-0", "mnist-1"]  # rack a holds one 4-cpu pod, rack b two
    assert {kube.objects[("Pod", f"mnist-{r}")]["spec"]["nodeSelector"][rack] for r in (0, 1)} == {"b"}



def test_a_jobs_next_status_pass_waits_twice_what_its_last_took_to_read_the_pods() -> None:
    reconciler, _, pods = reconciler_for(ddpjob({"phase": "Running", "attempt": 0}))
    assert reconciler._pace(KEY) == 0.0, "a job never passed waits for nothing"
    pods.set(ddpjob(), [pod(0, "running"), pod(1, "running")])
    run(reconciler.reconcile(KEY))
    took = reconciler._of(KEY).read_seconds
    assert 0 < took < 1
    assert reconciler._pace(KEY) == reconciler_module.PASS_PACE * took
    reconciler.forget(KEY)
    assert reconciler._pace(KEY) == 0.0


def test_a_creation_pass_waits_for_the_watch_to_bring_the_pods_the_last_one_made() -> None:
    job = ddpjob({"phase": "Pending", "attempt": 0})
    reconciler, kube, pods = reconciler_for(job)
    reconciler.clock = Clock()
    run(reconciler.create_children(KEY))
    assert kube.created("Pod") == ["mnist-0", "mnist-1"]
    calls = len(kube.calls)

    pods.set(job, [pod(0, "pending")])  # the watch has brought one of the two
    run(reconciler.create_children(KEY))
    assert len(kube.calls) == calls, "a pass on a cache without its own pods acted: it would count rank 1 missing"

    pods.set(job, [pod(0, "pending"), pod(1, "pending")])
    run(reconciler.reconcile(KEY))  # the status pass the watch's news starts forgets the pods seen
    assert reconciler._of(KEY).unseen == {}
    pods.set(job, [pod(0, "pending")])  # rank 1's pod deleted since it was seen: the next pass makes it again
    del kube.objects[("Pod", "mnist-1")]
    run(reconciler.create_children(KEY))
    assert kube.calls[calls:] == [("create", "Pod", "mnist-1")]


def test_a_pod_made_and_never_seen_is_waited_for_a_while_only() -> None:
    job = ddpjob({"phase": "Pending", "attempt": 0})
    reconciler, kube, pods = reconciler_for(job)
    reconciler.clock = clock = Clock()
    run(reconciler.create_children(KEY))
    memory = reconciler._of(KEY)
    assert memory.awaited(set(), clock(), 0) == UNSEEN_WAIT
    assert memory.awaited({("mnist-0", 0)}, clock() + 4, 0) == UNSEEN_WAIT - 4
    assert memory.awaited({("mnist-0", 1)}, clock() + 4, 0) == UNSEEN_WAIT - 4, "a pod of another attempt is not it"
    assert memory.awaited(set(), clock() + UNSEEN_WAIT, 0) is None, "deleted before its watch saw it, or a relist"


def test_a_restarts_creation_pass_does_not_wait_for_the_old_attempts_pods_never_seen() -> None:
    job = ddpjob({"phase": "Pending", "attempt": 0})
    reconciler, kube, pods = reconciler_for(job)
    reconciler.clock = Clock()
    run(reconciler.create_children(KEY))  # attempt 0's pods, never seen: deleted by the restart meanwhile
    restarted = ddpjob({"phase": "Restarting", "attempt": 1})
    reconciler.jobs.put(restarted)
    for name in ("mnist-0", "mnist-1"):
        del kube.objects[("Pod", name)]
    run(reconciler.create_children(KEY))
    assert kube.created("Pod")[-2:] == ["mnist-0", "mnist-1"], "attempt 1's pods waited for attempt 0's"
    assert {attempt for _, attempt in reconciler._of(KEY).unseen} == {1}
