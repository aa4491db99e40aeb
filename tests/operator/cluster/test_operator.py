"""The operator against a real API server: kwok plays the kubelet, the tests end containers."""

from __future__ import annotations

import re
from typing import Any

import pytest

from ddp_contract import api, labels
from ddp_operator import constants as c
from fakenodes import on_fake_nodes
from kube import PodLives, env_of, wait_until


def test_job_gets_a_headless_service_and_one_wired_pod_per_rank(jobs) -> None:
    job = jobs.create("wired", worldSize=3, masterPort=23456)
    status = jobs.wait_phase("wired", c.PHASE_RUNNING)
    assert status["ready"] == "3/3" and status["readyRanks"] == 3 and status["restarts"] == 0

    service = jobs.core.read_namespaced_service("wired", jobs.namespace)
    assert service.spec.cluster_ip == "None"
    assert service.spec.publish_not_ready_addresses is True
    assert service.spec.ports[0].port == 23456

    pods = sorted(jobs.pods("wired"), key=lambda p: int(p.metadata.labels[labels.LABEL_RANK]))
    assert [p.metadata.name for p in pods] == ["wired-0", "wired-1", "wired-2"]
    for rank, pod in enumerate(pods):
        env = env_of(pod)
        assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "3" and env["MASTER_PORT"] == "23456"
        assert env["MASTER_ADDR"] == f"wired-0.wired.{jobs.namespace}.svc"
        assert env["DDP_JOB_UID"] == job["metadata"]["uid"]
        assert pod.spec.hostname == pod.metadata.name and pod.spec.subdomain == "wired"
        owner = pod.metadata.owner_references[0]
        assert (owner.kind, owner.uid, owner.controller) == (api.KIND, job["metadata"]["uid"], True)
    assert {e.reason for e in jobs.events("wired")} >= {c.REASON_ALL_READY}


def test_gpu_ranks_ask_for_their_gpus_and_land_on_gpu_nodes(jobs) -> None:
    jobs.create("gpus", worldSize=2, gpusPerRank=4)
    jobs.wait_phase("gpus", c.PHASE_RUNNING)
    for pod in jobs.pods("gpus"):
        trainer = next(x for x in pod.spec.containers if x.name == labels.CONTAINER_NAME)
        assert trainer.resources.limits[c.GPU_RESOURCE] == "4"
        node = jobs.core.read_node(pod.spec.node_name)
        assert int(node.status.allocatable[c.GPU_RESOURCE]) >= 4


def test_a_failed_rank_restarts_the_whole_gang_and_records_why(jobs, kubectl) -> None:
    jobs.create("gang", worldSize=3, backoffLimit=2)
    jobs.wait_phase("gang", c.PHASE_RUNNING)
    first = {p.metadata.uid for p in jobs.pods("gang")}

    node = jobs.core.read_namespaced_pod("gang-1", jobs.namespace).spec.node_name
    output = "\n".join(f"step {i}: loss 0.5" for i in range(40)) + "\nKilled"
    jobs.finish("gang-1", 137, "OOMKilled", message=output)

    pods = jobs.wait_pods("gang", 3, attempt=1)
    assert first.isdisjoint({p.metadata.uid for p in pods}), "every rank must be recreated, not only rank 1"
    status = jobs.wait_phase("gang", c.PHASE_RUNNING)
    assert status["restarts"] == 1 and status["attempt"] == 1
    last_lines = "\n".join(output.splitlines()[-20:])
    assert status["failedRank"] == {"rank": 1, "pod": "gang-1", "node": node, "exitCode": 137, "signal": "SIGKILL",
                                    "oomKilled": True, "reason": "OOMKilled", "message": last_lines,
                                    "kind": c.KIND_PROGRAM, "attempt": 0}  # no step: not the runtime's line
    warnings = [e.message for e in jobs.events("gang") if e.type == "Warning"]
    assert any("rank 1" in m and "137" in m and node in m and "SIGKILL" in m for m in warnings), warnings
    described = kubectl("describe", "ddpjob", "gang", "-n", jobs.namespace).stdout
    assert re.search(r"Oom Killed: +true", described) and re.search(r"Node: +" + node, described), described
    assert "step 39: loss 0.5" in described and "step 19:" not in described, described


def test_backoff_exhaustion_fails_the_job_naming_rank_pod_and_exit_code(jobs) -> None:
    jobs.create("exhaust", worldSize=2, backoffLimit=1)
    jobs.wait_phase("exhaust", c.PHASE_RUNNING)
    jobs.finish("exhaust-0", 134)
    jobs.wait_pods("exhaust", 2, attempt=1)
    jobs.wait_phase("exhaust", c.PHASE_RUNNING)

    jobs.finish("exhaust-1", 139)

    status = jobs.wait_phase("exhaust", c.PHASE_FAILED)
    assert status["reason"] == c.REASON_BACKOFF_LIMIT
    assert "rank 1" in status["message"] and "exhaust-1" in status["message"] and "139" in status["message"]
    assert status["restarts"] == 1 and status["completionTime"]
    failed = next(x for x in status["conditions"] if x["type"] == c.COND_FAILED)
    assert failed["status"] == "True"
    # The surviving rank is stopped, not left holding its GPU; the failed one stays for its logs.
    wait_until(lambda: [p.metadata.name for p in jobs.pods("exhaust")] == ["exhaust-1"], 30,
               "the surviving rank to be deleted")


def test_exit_code_policy_retries_signals_and_fails_on_program_errors(jobs) -> None:
    jobs.create("signal", worldSize=2, restartPolicy="ExitCode")
    jobs.create("usererr", worldSize=2, restartPolicy="ExitCode")
    jobs.wait_phase("signal", c.PHASE_RUNNING)
    jobs.wait_phase("usererr", c.PHASE_RUNNING)

    jobs.finish("signal-0", 143)
    jobs.finish("usererr-0", 1)

    assert jobs.wait_phase("usererr", c.PHASE_FAILED)["reason"] == c.REASON_PERMANENT
    jobs.wait_pods("signal", 2, attempt=1)
    assert jobs.wait_phase("signal", c.PHASE_RUNNING)["restarts"] == 1
    assert jobs.status("usererr")["restarts"] == 0


def test_an_evicted_rank_is_retried_under_the_exit_code_policy(jobs) -> None:
    jobs.create("evicted", worldSize=2, restartPolicy="ExitCode")
    jobs.wait_phase("evicted", c.PHASE_RUNNING)
    jobs.evict("evicted-1")
    jobs.wait_pods("evicted", 2, attempt=1)
    status = jobs.wait_phase("evicted", c.PHASE_RUNNING)
    assert status["restarts"] == 1 and status["failedRank"]["reason"] == "Evicted"


def test_job_succeeds_when_every_rank_exits_zero(jobs) -> None:
    jobs.create("done", worldSize=2)
    jobs.wait_phase("done", c.PHASE_RUNNING)
    jobs.finish("done-0", 0)
    assert jobs.observed("done")["phase"] == c.PHASE_RUNNING, "one rank finishing is not the job finishing"
    jobs.finish("done-1", 0)
    status = jobs.wait_phase("done", c.PHASE_SUCCEEDED)
    assert status["completionTime"] and status["reason"] == c.REASON_SUCCEEDED


def test_operator_restart_mid_job_creates_no_duplicates_and_loses_no_state(jobs, operator) -> None:
    jobs.create("survivor", worldSize=4, backoffLimit=3)
    jobs.wait_phase("survivor", c.PHASE_RUNNING)
    before = {p.metadata.name: p.metadata.uid for p in jobs.pods("survivor")}

    operator.restart()
    jobs.observed("survivor")
    assert {p.metadata.name: p.metadata.uid for p in jobs.pods("survivor", include_deleting=True)} == before

    operator.stop()
    jobs.finish("survivor-2", 137)  # fails while nobody watches
    operator.start()

    pods = jobs.wait_pods("survivor", 4, attempt=1)
    assert sorted(p.metadata.name for p in pods) == ["survivor-0", "survivor-1", "survivor-2", "survivor-3"]
    status = jobs.wait_phase("survivor", c.PHASE_RUNNING)
    assert status["restarts"] == 1 and status["attempt"] == 1

    operator.restart()
    assert jobs.observed("survivor")["restarts"] == 1
    assert len(jobs.pods("survivor", include_deleting=True)) == 4


def test_deleting_a_job_leaves_no_orphans(jobs) -> None:
    jobs.create("doomed", worldSize=3)
    jobs.wait_phase("doomed", c.PHASE_RUNNING)
    jobs.delete("doomed")

    def orphans() -> list[str]:
        pods = [p.metadata.name for p in jobs.pods("doomed", include_deleting=True)]
        services = [s.metadata.name for s in jobs.core.list_namespaced_service(jobs.namespace).items]
        return pods + services

    wait_until(lambda: orphans() == [], 30, "the garbage collector to remove the pods and the service")
    assert jobs.get("doomed") is None


def test_suspend_deletes_the_pods_and_resume_recreates_them(jobs) -> None:
    jobs.create("pausable", worldSize=2)
    jobs.wait_phase("pausable", c.PHASE_RUNNING)

    jobs.patch_spec("pausable", suspend=True)
    status = jobs.wait_phase("pausable", c.PHASE_SUSPENDED)
    assert "startTime" not in status
    wait_until(lambda: jobs.pods("pausable", include_deleting=True) == [], 30, "the pods to be deleted")

    jobs.patch_spec("pausable", suspend=False)
    status = jobs.wait_phase("pausable", c.PHASE_RUNNING)
    assert len(jobs.pods("pausable")) == 2 and status["restarts"] == 0
    assert {e.reason for e in jobs.events("pausable")} >= {c.REASON_SUSPENDED, c.REASON_ALL_READY}


def test_a_job_created_suspended_makes_no_pods_until_resumed(jobs) -> None:
    with PodLives(jobs, "queued") as lives:
        jobs.create("queued", worldSize=2, suspend=True)
        jobs.wait_phase("queued", c.PHASE_SUSPENDED)
        jobs.observed("queued")  # a later pass, with suspend still true
        assert lives.created() == {}, "a suspended job must create no pod, not even briefly"
        jobs.patch_spec("queued", suspend=False)
        jobs.wait_phase("queued", c.PHASE_RUNNING)
        assert lives.created() == {"0": 2}


def test_active_deadline_fails_the_job_and_stops_its_pods(jobs) -> None:
    jobs.create("late", worldSize=2, activeDeadlineSeconds=3)
    jobs.wait_phase("late", c.PHASE_RUNNING)
    status = jobs.wait_phase("late", c.PHASE_FAILED, timeout=20)
    assert status["reason"] == c.REASON_DEADLINE
    wait_until(lambda: jobs.pods("late", include_deleting=True) == [], 30, "the pods to be deleted")


def test_finished_job_is_deleted_after_its_ttl(jobs) -> None:
    jobs.create("shortlived", worldSize=1, ttlSecondsAfterFinished=2)
    jobs.wait_phase("shortlived", c.PHASE_RUNNING)
    jobs.finish("shortlived-0", 0)
    jobs.wait_phase("shortlived", c.PHASE_SUCCEEDED)
    assert jobs.get("shortlived") is not None
    wait_until(lambda: jobs.get("shortlived") is None, 20, "the TTL to delete the job")


def test_spec_the_schema_cannot_catch_is_marked_failed_and_the_operator_carries_on(jobs, operator) -> None:
    # The schema keeps the template open; the operator refuses a trainer container that sets MASTER_ADDR.
    template = {"spec": {"containers": [{"name": "trainer", "env": [{"name": "MASTER_ADDR", "value": "x"}]}]}}
    jobs.create("sneaky", worldSize=2, template=template)
    # The API server refuses the pod (an invalid volume name): the operator reports its message.
    bad_volume = {"spec": {"volumes": [{"name": "Not_A_DNS_Label", "emptyDir": {}}]}}
    jobs.create("refused", worldSize=2, template=bad_volume)

    sneaky = jobs.wait_phase("sneaky", c.PHASE_FAILED)
    assert sneaky["reason"] == c.REASON_INVALID_SPEC and "MASTER_ADDR" in sneaky["message"]
    assert "template" in sneaky["message"]
    refused = jobs.wait_phase("refused", c.PHASE_FAILED)
    assert refused["reason"] == c.REASON_INVALID_SPEC and "Not_A_DNS_Label" in refused["message"]
    assert jobs.pods("sneaky", include_deleting=True) == []

    jobs.create("fine", worldSize=1)
    jobs.wait_phase("fine", c.PHASE_RUNNING)
    assert operator.process.poll() is None


def test_a_gang_whose_ranks_fit_no_node_says_so_by_rank_and_fails_at_the_startup_deadline(jobs) -> None:
    # The local cluster's nodes have 8 GPUs each: no rank can ever be scheduled.
    jobs.create("toobig", worldSize=2, gpusPerRank=16, startupDeadlineSeconds=5)

    def says_why() -> dict | None:
        status = jobs.status("toobig")
        return status if "ranks 0-1 (GangTooLarge)" in status.get("message", "") else None

    status = wait_until(says_why, 30, "the job to say its ranks fit no node")
    assert status["reason"] == c.REASON_GANG_TOO_LARGE
    assert status["phase"] == c.PHASE_PENDING
    # The tests' ranks ask for kwok's nodes by nodeSelector (fakenodes.py), which the message names.
    assert re.search(r"ranks 0-1 \(GangTooLarge\): each rank needs 16 nvidia.com/gpu; the largest of the "
                     r"\d+ schedulable nodes matching its nodeSelector has 8$", status["message"]), status
    blocked = next(x for x in status["conditions"] if x["type"] == c.COND_RANKS_BLOCKED)
    assert (blocked["status"], blocked["reason"]) == ("True", c.REASON_GANG_TOO_LARGE)

    def warned() -> list:
        return [e for e in jobs.events("toobig") if e.reason == c.REASON_GANG_TOO_LARGE and "ranks 0-1" in e.message]

    assert all(e.type == "Warning" for e in wait_until(warned, 10, "an Event saying so"))
    status = jobs.wait_phase("toobig", c.PHASE_FAILED, timeout=30)
    assert status["reason"] == c.REASON_GANG_TOO_LARGE
    assert status["message"].endswith("still so after startupDeadlineSeconds=5")


def test_ranks_held_up_past_the_startup_deadline_fail_the_job_and_free_the_rest(jobs) -> None:
    # No node has that name, so no rank can ever be scheduled: without the deadline the job waits forever.
    jobs.create("stranded", worldSize=2, gpusPerRank=0, startupDeadlineSeconds=2,
                template={"spec": {"nodeSelector": {"kubernetes.io/hostname": "no-such-node"}}})
    status = jobs.wait_phase("stranded", c.PHASE_FAILED, timeout=30)
    assert status["reason"] == c.REASON_UNSCHEDULABLE
    assert status["message"].endswith("still so after startupDeadlineSeconds=2")
    # The scheduler's count of nodes: tests beside this one add nodes of their own.
    assert re.search(r"ranks? 0(-1)? \(Unschedulable\): 0/\d+ nodes are available", status["message"]), status
    wait_until(lambda: jobs.pods("stranded") == [], 30, "the held-up gang's pods to be deleted")


def stranger(jobs, kind: str, name: str, pod_labels: dict[str, str] | None = None) -> Any:
    """An object the job needs the name of, made by someone else (no owner; no labels unless given)."""
    if kind == "Pod":
        body = {"metadata": {"name": name, "labels": pod_labels or {}},
                "spec": on_fake_nodes({"containers": [{"name": "app", "image": "app:1"}]})}
        return jobs.core.create_namespaced_pod(jobs.namespace, body)
    body = {"metadata": {"name": name}, "spec": {"selector": {"app": "other"}, "ports": [{"port": 80}]}}
    return jobs.core.create_namespaced_service(jobs.namespace, body)


def test_a_pod_name_held_by_a_stranger_is_reported_and_left_alone(jobs) -> None:
    theirs = stranger(jobs, "Pod", "crowded-1")

    def says_why() -> dict | None:
        status = jobs.status("crowded")
        return status if status.get("reason") == c.REASON_NAME_IN_USE else None

    jobs.create("crowded", worldSize=2)
    status = wait_until(says_why, 30, "the job to say what holds its name")
    assert "rank 1 (NameInUse): pod crowded-1 exists and is not this job's" in status["message"], status
    assert [p.metadata.name for p in jobs.pods("crowded")] == ["crowded-0"]  # the free rank goes ahead
    held = jobs.core.read_namespaced_pod("crowded-1", jobs.namespace)
    assert held.metadata.uid == theirs.metadata.uid and not held.metadata.owner_references
    assert held.metadata.deletion_timestamp is None

    jobs.core.delete_namespaced_pod("crowded-1", jobs.namespace, grace_period_seconds=0)
    status = jobs.wait_phase("crowded", c.PHASE_RUNNING, timeout=30)  # no watch tells us: the recheck does
    blocked = next(x for x in status["conditions"] if x["type"] == c.COND_RANKS_BLOCKED)
    assert blocked["status"] == "False"


@pytest.mark.parametrize("attempt", [0, 7])
def test_a_stranger_pod_with_the_job_s_labels_is_neither_counted_nor_deleted(jobs, attempt: int) -> None:
    """Orphaned from a predecessor of the same name (kubectl delete --cascade=orphan), or made by hand:
    labelled as this attempt's rank 1 it must not pass for a ready rank, labelled as an old attempt's
    it must not be deleted as one."""
    name = f"orphaned-{attempt}"
    theirs = stranger(jobs, "Pod", f"{name}-1", {labels.LABEL_JOB_NAME: name, labels.LABEL_RANK: "1",
                                                   labels.LABEL_ATTEMPT: str(attempt)})
    wait_until(lambda: jobs.core.read_namespaced_pod(f"{name}-1", jobs.namespace).status.phase == "Running", 30,
               "the stranger pod Running (kwok runs it)")
    jobs.create(name, worldSize=2)

    def says_why() -> dict | None:
        status = jobs.status(name)
        return status if status.get("reason") == c.REASON_NAME_IN_USE else None

    status = wait_until(says_why, 30, "the job to say what holds rank 1's name")
    assert f"rank 1 (NameInUse): pod {name}-1 exists and is not this job's" in status["message"], status
    assert status.get("phase") != c.PHASE_RUNNING and status.get("ready") != "2/2", status
    held = jobs.core.read_namespaced_pod(f"{name}-1", jobs.namespace)
    assert held.metadata.uid == theirs.metadata.uid and held.metadata.deletion_timestamp is None
    assert not held.metadata.owner_references


def test_a_service_name_held_by_a_stranger_stops_the_job_before_any_pod(jobs) -> None:
    theirs = stranger(jobs, "Service", "shadowed")
    jobs.create("shadowed", worldSize=2)

    def says_why() -> dict | None:
        status = jobs.status("shadowed")
        return status if status.get("reason") == c.REASON_NAME_IN_USE else None

    status = wait_until(says_why, 30, "the job to say what holds its Service's name")
    assert "ranks 0-1 (NameInUse): Service shadowed exists and is not this job's" in status["message"], status
    assert jobs.pods("shadowed", include_deleting=True) == []
    kept = jobs.core.read_namespaced_service("shadowed", jobs.namespace)
    assert kept.metadata.uid == theirs.metadata.uid and kept.spec.selector == {"app": "other"}


def test_pods_of_several_ranks_ask_for_all_their_gpus_and_restart_as_one_gang(jobs) -> None:
    jobs.create("packed", worldSize=8, ranksPerPod=4, gpusPerRank=1)
    status = jobs.wait_phase("packed", c.PHASE_RUNNING)
    assert (status["ready"], status["readyPods"], status["totalPods"]) == ("8/8", 2, 2)
    pods = sorted(jobs.pods("packed"), key=lambda p: p.metadata.name)
    assert [p.metadata.name for p in pods] == ["packed-0", "packed-1"]
    for index, pod in enumerate(pods):
        trainer = next(x for x in pod.spec.containers if x.name == labels.CONTAINER_NAME)
        assert trainer.resources.limits[c.GPU_RESOURCE] == "4"
        env = env_of(pod)
        assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["NODE_RANK"]) == ("8", "4", str(index))
    jobs.finish("packed-1", 137)
    jobs.wait_pods("packed", 2, attempt=1)
    restarted = jobs.wait_phase("packed", c.PHASE_RUNNING)
    assert restarted["restarts"] == 1 and restarted["failedRank"]["rank"] == 4 and restarted["ready"] == "8/8"
    assert any("ranks 4-7 (pod packed-1" in e.message for e in jobs.events("packed"))
