"""Elastic world size through the operator at scale, on kwok nodes: a 256-rank job that loses four
nodes goes on with the ranks that fit, and grows back once nodes return, replacing no pod but the
lost ones. The test plays rank 0 (status.rendezvous, status.lastCheckpoint); kwok plays the kubelets."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ddp_contract import api
from ddp_contract.jobstatus import STATUS_CHECKPOINT_REQUESTED, STATUS_MEMBERS, STATUS_WORLD_SIZE
from ddp_contract.timestamps import rfc3339
from ddp_operator import constants as c
from kube import Jobs, PodLives, wait_until
from testnodes import NodeMaker, pinned

WORLD, MINIMUM, GPUS_PER_NODE, LOST_NODES = 256, 128, 8, 4


def play_rank_0(jobs: Jobs, name: str, **status: Any) -> None:
    jobs.custom.patch_namespaced_custom_object_status(api.GROUP, api.VERSION, jobs.namespace, api.PLURAL, name,
                                                      {"status": status})


def formed(jobs: Jobs, name: str, attempt: int, timeout: float = 120) -> dict[str, Any]:
    """The job Running at `attempt`, once rank 0 (played here) said its gang formed."""
    def gathered() -> bool:  # as rank 0 would, once every rank of the gang has joined
        status = jobs.status(name)
        return status.get("attempt") == attempt and status.get("readyPods") == status.get("totalPods")

    wait_until(gathered, timeout, f"{name}'s gang of attempt {attempt} running")
    play_rank_0(jobs, name, rendezvous={"attempt": attempt, "time": rfc3339(datetime.now(UTC))})
    status = jobs.wait_phase(name, c.PHASE_RUNNING, timeout=timeout)
    assert status["attempt"] == attempt, status
    return status


def test_a_256_rank_job_shrinks_and_grows_replacing_only_the_lost_ranks_pods(jobs: Jobs, own_nodes: NodeMaker) -> None:
    pool = {"ddp-operator-test/pool": jobs.namespace}
    nodes = own_nodes.kwok_many(pool, WORLD // GPUS_PER_NODE, GPUS_PER_NODE)
    with PodLives(jobs, "wide") as lives:
        jobs.create("wide", worldSize=WORLD, minWorldSize=MINIMUM, gpusPerRank=1, entrypoint="train:main",
                    restartStrategy=api.RESTART_IN_PLACE, template={"spec": pinned(pool)})
        formed(jobs, "wide", 0, timeout=240)
        lost = set(nodes[:LOST_NODES])
        lost_pods = {p.metadata.name for p in jobs.pods("wide") if p.spec.node_name in lost}
        assert len(lost_pods) == LOST_NODES * GPUS_PER_NODE

        for node in lost:
            own_nodes.delete(node)
        shrunk = jobs.wait_condition("wide", c.COND_SHRUNK, "True", timeout=120)
        left = WORLD - len(lost_pods)
        assert shrunk[STATUS_WORLD_SIZE] == left and len(shrunk[STATUS_MEMBERS]) == left
        assert {f"wide-{i}" for i in range(WORLD)} - {f"wide-{i}" for i in shrunk[STATUS_MEMBERS]} == lost_pods
        status = formed(jobs, "wide", shrunk["attempt"])
        # Each node's loss may restart the gang (they go one by one); the shrink spent nothing.
        failures = status["restarts"]
        assert status["ready"] == f"{left}/{left}" and status["attempt"] == failures + 1
        assert failures == status["infrastructureRestarts"] >= 1
        # Only the lost ranks' pods were replaced; theirs wait Pending for capacity.
        assert sum(lives.created().values()) == WORLD + len(lost_pods)
        assert sum(lives.deleted_of(a) for a in range(shrunk["attempt"] + 1)) == len(lost_pods)
        waiting = {p.metadata.name: p.status.phase for p in jobs.pods("wide") if p.metadata.name in lost_pods}
        assert set(waiting.values()) == {"Pending"}

        own_nodes.kwok_many(pool, LOST_NODES, GPUS_PER_NODE)
        wait_until(lambda: all(p.status.phase == "Running" for p in jobs.pods("wide")), 120, "every pod Running")
        assert jobs.status("wide")[STATUS_WORLD_SIZE] == left  # grown at the next checkpoint, not before
        wait_until(lambda: jobs.status("wide").get(STATUS_CHECKPOINT_REQUESTED), 30, "a checkpoint asked of rank 0")
        play_rank_0(jobs, "wide", lastCheckpoint={"step": 100, "uri": "s3://b/c", "time": rfc3339(datetime.now(UTC))})
        grown = jobs.wait_condition("wide", c.COND_SHRUNK, "False", timeout=60)
        assert grown[STATUS_WORLD_SIZE] == WORLD and grown[STATUS_MEMBERS] == list(range(WORLD))
        assert STATUS_CHECKPOINT_REQUESTED not in grown
        status = formed(jobs, "wide", grown["attempt"])
        assert status["ready"] == f"{WORLD}/{WORLD}" and status["restarts"] == failures  # resizes spend nothing
        assert status["attempt"] == failures + 2
        assert sum(lives.created().values()) == WORLD + len(lost_pods)  # growing created no pod
        reasons = [e.reason for e in jobs.events("wide") if e.reason in (c.REASON_SHRUNK, c.REASON_GROWN)]
        assert sorted(reasons) == [c.REASON_GROWN, c.REASON_SHRUNK]


def test_a_job_starts_with_the_ranks_that_fit_once_the_settle_time_has_passed(jobs: Jobs, own_nodes: NodeMaker) -> None:
    pool = {"ddp-operator-test/pool": jobs.namespace}
    own_nodes.kwok(pool, gpus=2)  # room for ranks 0-1 of 4
    with PodLives(jobs, "eager") as lives:
        jobs.create("eager", worldSize=4, minWorldSize=2, gpusPerRank=1, entrypoint="train:main",
                    restartStrategy=api.RESTART_IN_PLACE, elasticSettleSeconds=3,
                    template={"spec": pinned(pool)})
        shrunk = jobs.wait_condition("eager", c.COND_SHRUNK, "True", timeout=60)
        started = datetime.fromisoformat(shrunk["startTime"].replace("Z", "+00:00"))
        resized = next(x for x in shrunk["conditions"] if x["type"] == c.COND_SHRUNK)["lastTransitionTime"]
        assert (datetime.fromisoformat(resized.replace("Z", "+00:00")) - started).total_seconds() >= 3
        running = sorted(int(p.metadata.name.rsplit("-", 1)[1]) for p in jobs.pods("eager") if p.status.phase == "Running")
        assert shrunk[STATUS_MEMBERS] == running and shrunk[STATUS_WORLD_SIZE] == 2, shrunk
        assert "do not fit" in shrunk["message"] and shrunk["restarts"] == 0
        formed(jobs, "eager", shrunk["attempt"])
        assert sum(lives.created().values()) == 4 and lives.deleted_of(0) == 0  # the two left out wait


def test_a_job_a_quota_holds_in_part_starts_with_what_fits_and_grows_when_the_quota_does(
        jobs: Jobs, own_nodes: NodeMaker) -> None:
    pool = {"ddp-operator-test/pool": jobs.namespace}
    own_nodes.kwok(pool, gpus=4)
    jobs.quota("gpus", {"requests.nvidia.com/gpu": "2"})  # room for ranks 0-1 of 4
    with PodLives(jobs, "quoted") as lives:
        jobs.create("quoted", worldSize=4, minWorldSize=2, gpusPerRank=1, entrypoint="train:main",
                    restartStrategy=api.RESTART_IN_PLACE, elasticSettleSeconds=3,
                    template={"spec": pinned(pool)})
        shrunk = jobs.wait_condition("quoted", c.COND_SHRUNK, "True", timeout=60)
        assert shrunk[STATUS_MEMBERS] == [0, 1] and shrunk[STATUS_WORLD_SIZE] == 2, shrunk
        assert "quoted-2: ResourceQuota gpus cannot hold the whole gang, so only 2 of its pods are created " \
               "(spec.minWorldSize)" in shrunk["message"], shrunk["message"]
        assert sorted(p.metadata.name for p in jobs.pods("quoted")) == ["quoted-0", "quoted-1"]
        status = formed(jobs, "quoted", shrunk["attempt"])
        assert status["ready"] == "2/2" and status["restarts"] == 0
        assert status["reason"] != c.REASON_QUOTA_EXCEEDED  # the others wait outside the gang: it is not held up

        jobs.core.patch_namespaced_resource_quota("gpus", jobs.namespace, {"spec": {"hard": {"requests.nvidia.com/gpu": "4"}}})
        # Tried again on the quota's backoff (5 s, then doubling): pods 2 and 3 come, run, and are asked
        # to join at the next checkpoint.
        wait_until(lambda: len([p for p in jobs.pods("quoted") if p.status.phase == "Running"]) == 4, 90, "4 pods Running")
        asked = wait_until(lambda: jobs.status("quoted").get(STATUS_CHECKPOINT_REQUESTED), 30, "a checkpoint asked for")
        assert asked == {"since": asked["since"]}  # no checkpoint yet: any answers
        play_rank_0(jobs, "quoted", lastCheckpoint={"step": 7, "uri": "s3://b/c", "time": rfc3339(datetime.now(UTC))})
        grown = jobs.wait_condition("quoted", c.COND_SHRUNK, "False", timeout=60)
        assert grown[STATUS_MEMBERS] == [0, 1, 2, 3] and grown[STATUS_WORLD_SIZE] == 4
        assert formed(jobs, "quoted", grown["attempt"])["ready"] == "4/4"
        assert sum(lives.created().values()) == 4 and sum(lives.deleted_of(a) for a in range(grown["attempt"] + 1)) == 0
