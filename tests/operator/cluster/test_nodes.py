"""Nodes against a real control plane: a node gone NotReady or deleted under a rank, and a gang too large.

Each test makes its own nodes (gpu-node-test-<id>) with a label only its job selects and a taint only its job
tolerates, so the cluster's shared nodes are never touched and other tests' pods never land on its nodes.
"""

from __future__ import annotations

import re
from typing import Any

from ddp_operator import constants as c
from ddp_operator.kubelet import NODE_LOST_TAINTS
from kube import Jobs, wait_until
from testnodes import NodeMaker, pinned

GRACE = 5  # nodeLostGraceSeconds: past the node lifecycle controller's 5 s tick, which taints the node


def pool(jobs: Jobs) -> dict[str, str]:
    """A label only this test's nodes carry."""
    return {"ddp-operator-test/pool": jobs.namespace}


def on_own_nodes(jobs: Jobs, **spec: Any) -> dict[str, Any]:
    return {"gpusPerRank": 8, **spec, "template": {"spec": pinned(pool(jobs))}}


def node_of(jobs: Jobs, job: str) -> dict[str, str]:
    return {p.metadata.name: p.spec.node_name for p in jobs.pods(job, include_deleting=True)}


def running_again(jobs: Jobs, job: str, attempt: int, timeout: float) -> dict[str, Any]:
    def settled() -> dict[str, Any] | None:
        status = jobs.status(job)
        return status if status.get("phase") == c.PHASE_RUNNING and status.get("attempt") == attempt else None

    try:
        return wait_until(settled, timeout, f"{job} Running again at attempt {attempt}")  # type: ignore[return-value]
    except AssertionError as error:
        raise AssertionError(f"{error}; status is {jobs.status(job)}; pods on {node_of(jobs, job)}") from None


def test_ranks_on_a_node_gone_not_ready_are_lost_forced_off_it_and_restarted_elsewhere(jobs: Jobs,
                                                                                       own_nodes: NodeMaker) -> None:
    doomed = own_nodes.hand_played(pool(jobs))
    healthy = own_nodes.kwok(pool(jobs))
    jobs.create("lossy", worldSize=2, nodeLostGraceSeconds=GRACE, **on_own_nodes(jobs))
    jobs.wait_phase("lossy", c.PHASE_RUNNING)
    before = {p.metadata.name: p for p in jobs.pods("lossy")}
    lost = next(name for name, p in before.items() if p.spec.node_name == doomed.name)  # 8 GPUs a node: one rank each
    tolerations = {(t.key, t.effect, t.toleration_seconds) for t in before[lost].spec.tolerations}
    assert {(key, "NoExecute", GRACE) for key in NODE_LOST_TAINTS} <= tolerations
    spare = own_nodes.kwok(pool(jobs))  # room for the new gang

    died = doomed.die()
    status = running_again(jobs, "lossy", 1, timeout=60)

    assert status["restarts"] == 1 and status["failedRank"]["reason"] == c.REASON_NODE_LOST, status
    assert (status["infrastructureRestarts"], status.get("programRestarts", 0)) == (1, 0), "a lost node is no program error"
    assert (status["failedRank"]["pod"], status["failedRank"]["node"]) == (lost, doomed.name)
    assert re.match(rf"node {doomed.name} NotReady since \S+ \(Ready Unknown: NodeStatusUnknown\)$",
                    status["failedRank"]["message"]), status["failedRank"]
    # The pod on the dead node, which no kubelet would ever finish deleting, was forced off it.
    assert sorted(node_of(jobs, "lossy").values()) == sorted([healthy, spare])
    assert {p.metadata.uid for p in jobs.pods("lossy", include_deleting=True)}.isdisjoint(
        p.metadata.uid for p in before.values())
    warnings = [e for e in jobs.events("lossy") if e.reason == c.REASON_NODE_LOST]
    assert warnings and warnings[0].type == "Warning" and doomed.name in warnings[0].message, warnings
    lost_after = (warnings[0].first_timestamp - died).total_seconds()
    assert GRACE <= lost_after < GRACE + 30, f"the rank was lost {lost_after}s after its node went NotReady"


def test_ranks_on_a_deleted_node_restart_elsewhere_before_the_pod_gc_would_act(jobs: Jobs, own_nodes: NodeMaker) -> None:
    gone = own_nodes.kwok(pool(jobs))
    own_nodes.kwok(pool(jobs))
    jobs.create("uprooted", worldSize=2, **on_own_nodes(jobs))
    jobs.wait_phase("uprooted", c.PHASE_RUNNING)
    lost = next(name for name, node in node_of(jobs, "uprooted").items() if node == gone)
    own_nodes.kwok(pool(jobs))

    own_nodes.delete(gone)
    # The pod GC controller deletes pods bound to a missing node only after 40 s of quarantine.
    status = running_again(jobs, "uprooted", 1, timeout=30)

    failed = status["failedRank"]
    assert (failed["reason"], failed["pod"], failed["node"]) == (c.REASON_NODE_LOST, lost, gone), failed
    assert re.match(rf"node {gone} was deleted at \S+$", failed["message"]), failed
    assert gone not in node_of(jobs, "uprooted").values()


def test_a_gang_larger_than_its_nodes_says_so_and_runs_once_nodes_are_added(jobs: Jobs, own_nodes: NodeMaker) -> None:
    own_nodes.kwok(pool(jobs))
    jobs.create("roomy", worldSize=2, **on_own_nodes(jobs))

    def says_so() -> dict[str, Any] | None:
        status = jobs.status("roomy")
        return status if status.get("reason") == c.REASON_GANG_TOO_LARGE else None

    status = wait_until(says_so, 30, "the job to say its gang cannot fit")
    detail = "needs 16 nvidia.com/gpu (2 ranks x 8); the 1 schedulable node matching its nodeSelector has 8 in all"
    # One rank's pod, or both said as one ("ranks 0-1") once the scheduler has turned both down.
    assert re.search(rf"(rank [01]|ranks 0-1) \(GangTooLarge\): {re.escape(detail)}$", status["message"]), status
    blocked = next(x for x in status["conditions"] if x["type"] == c.COND_RANKS_BLOCKED)
    assert (blocked["status"], blocked["reason"]) == ("True", c.REASON_GANG_TOO_LARGE)
    wait_until(lambda: [e for e in jobs.events("roomy") if e.reason == c.REASON_GANG_TOO_LARGE and e.type == "Warning"],
               10, "a Warning Event saying so")

    own_nodes.kwok(pool(jobs))  # capacity appears: the gang fits now
    status = jobs.wait_phase("roomy", c.PHASE_RUNNING)
    blocked = next(x for x in status["conditions"] if x["type"] == c.COND_RANKS_BLOCKED)
    assert blocked["status"] == "False" and status["restarts"] == 0


def test_a_gang_that_fits_but_finds_its_nodes_full_is_unschedulable_not_too_large(jobs: Jobs, own_nodes: NodeMaker) -> None:
    own_nodes.kwok(pool(jobs))
    jobs.create("first", worldSize=1, **on_own_nodes(jobs))
    jobs.wait_phase("first", c.PHASE_RUNNING)
    jobs.create("second", worldSize=1, **on_own_nodes(jobs))

    def held() -> dict[str, Any] | None:
        status = jobs.status("second")
        return status if status.get("reason") == c.REASON_UNSCHEDULABLE else None

    status = wait_until(held, 30, "the job to say its rank cannot be scheduled")
    assert "rank 0 (Unschedulable): 0/" in status["message"] and "Insufficient nvidia.com/gpu" in status["message"]
    assert c.REASON_GANG_TOO_LARGE not in str(jobs.observed("second"))
