"""Elastic world size in the operator's pure functions: the spec, which pods make the gang
(podsummary), when it shrinks and grows (elastic, decision) and what status says (statuspatch)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from ddp_contract import api
from ddp_contract.jobstatus import STATUS_CHECKPOINT_REQUESTED, STATUS_MEMBERS, STATUS_WORLD_SIZE
from ddp_contract.resource import JobStatus
from ddp_contract.timestamps import rfc3339
from ddp_operator import constants as c
from ddp_operator.conditions import get_condition
from ddp_operator.decision import Action, decide
from ddp_operator.failures import PodProblem
from ddp_operator.podsummary import summarize_pods
from ddp_operator.spec import InvalidSpec, parse_spec
from ddp_operator.statuspatch import compute_status, events_for, next_phase
from podfixtures import JOB, NOW, job_spec, pod

FULL = "0/2 nodes are available: 2 Too many pods."
# Ranks 0-3, the gang may go down to two; it formed before (rank 0 said so for attempt 0).
ELASTIC = {"worldSize": 4, "minWorldSize": 2, "restartStrategy": api.RESTART_IN_PLACE}
FORMED = {"phase": c.PHASE_RUNNING, "attempt": 0, "recreatedAttempt": 0, "rendezvous": {"attempt": 0},
          "startTime": rfc3339(NOW - timedelta(minutes=5))}


def spec(**changes: Any) -> Any:
    return job_spec(**{**ELASTIC, **changes})


def summary(pods: list[dict[str, Any]], status: dict[str, Any], spec_: Any = None) -> Any:
    from ddp_operator.modes.elastic import members

    spec_ = spec_ or spec()
    return summarize_pods(pods, int(status.get("attempt", 0)), job_name=JOB, since=int(status.get("recreatedAttempt", 0)),
                          members=members(spec_, JobStatus.of(status)))


def test_min_world_size_makes_a_job_elastic_only_below_world_size_and_in_place() -> None:
    assert not job_spec(worldSize=4).elastic and job_spec(worldSize=4).min_pods == 4
    assert not spec(minWorldSize=4).elastic
    assert spec().elastic and spec().min_pods == 2
    assert spec(ranksPerPod=2).min_pods == 1
    with pytest.raises(InvalidSpec, match="minWorldSize.*restartStrategy InPlace"):
        parse_spec({**ELASTIC, "image": "t:1", "entrypoint": "t:m", "restartStrategy": api.RESTART_RECREATE})
    with pytest.raises(InvalidSpec, match="minWorldSize.*multiple of ranksPerPod 2"):
        spec(worldSize=4, ranksPerPod=2, minWorldSize=3)
    with pytest.raises(InvalidSpec, match="minWorldSize.*between 1 and 4"):
        spec(minWorldSize=5)


def test_pods_outside_the_gang_are_counted_apart_and_never_fail_it() -> None:
    status = {**FORMED, STATUS_MEMBERS: [0, 2]}
    pods = [pod(0), pod(1, "pending", unschedulable=FULL), pod(2), pod(3, "failed")]
    found = summary(pods, status)
    assert found.gang == (0, 2) and found.live_indices == {0, 2} and found.ready == 2 and found.failure is None
    assert found.waiting.names == (f"{JOB}-1",) and found.waiting.ended == (f"{JOB}-3",) and found.problems == ()
    assert [p.index for p in found.waiting.problems] == [1]
    assert next_phase(status, found, decide(spec(), status=status, summary=found, now=NOW), spec()) == c.PHASE_RUNNING
    decision = decide(spec(), status=status, summary=found, now=NOW)
    assert decision.action == Action.WAIT and decision.delete_pods == (f"{JOB}-3",)  # created again, to wait


def test_ranks_that_do_not_fit_after_the_gang_formed_are_left_out_at_once() -> None:
    status = {**FORMED, "phase": c.PHASE_RESTARTING, "attempt": 1}
    pods = [pod(0), pod(1, node="a"), pod(2, "pending", attempt=1, unschedulable=FULL),
            pod(3, "pending", attempt=1, unschedulable=FULL)]
    found = summary(pods, status)
    decision = decide(spec(), status=status, summary=found, now=NOW)
    assert (decision.action, decision.attempt, decision.members, decision.reason) == (
        Action.RESIZE, 2, (0, 1), c.REASON_SHRUNK)
    assert decision.delete_pods == ()  # they wait, Pending, for capacity
    assert "world size 4 -> 2 of 4" in decision.message and f"{JOB}-2: {FULL}" in decision.message
    patch = compute_status(spec(), status=status, summary=found, decision=decision, now=NOW)
    assert patch[STATUS_MEMBERS] == [0, 1] and patch[STATUS_WORLD_SIZE] == 2
    assert (patch["phase"], patch["attempt"], patch["restarts"]) == (c.PHASE_RESTARTING, 2, 0)  # no budget spent
    shrunk = get_condition(patch["conditions"], c.COND_SHRUNK)
    assert shrunk is not None and (shrunk["status"], shrunk["reason"]) == ("True", c.REASON_SHRUNK)
    assert ("Warning", c.REASON_SHRUNK, decision.message) in events_for(status, patch)


def test_at_the_start_ranks_that_do_not_fit_are_waited_for_the_settle_time() -> None:
    started = {"phase": c.PHASE_STARTING, "attempt": 0, "startTime": rfc3339(NOW - timedelta(seconds=10))}
    pods = [pod(0), pod(1), pod(2, "pending", unschedulable=FULL), pod(3, "pending", unschedulable=FULL)]
    found = summary(pods, started)
    waiting = decide(spec(), status=started, summary=found, now=NOW)
    assert waiting.action == Action.WAIT and waiting.recheck_after == pytest.approx(50)
    later = decide(spec(), status=started, summary=found, now=NOW + timedelta(seconds=51))
    assert (later.action, later.members) == (Action.RESIZE, (0, 1))


def test_ranks_a_quota_refused_are_started_without_after_the_settle_time_and_wait_outside_the_gang() -> None:
    quota = "ResourceQuota team cannot hold the whole gang, so only 2 of its pods are created (spec.minWorldSize)"
    refused = [PodProblem(r, c.REASON_QUOTA_EXCEEDED, quota) for r in (2, 3)]
    started = {"phase": c.PHASE_STARTING, "attempt": 0, "startTime": rfc3339(NOW - timedelta(seconds=10))}
    found = summary([pod(0, "pending", node="a"), pod(1, "pending", node="a")], started).with_problems(refused)
    waiting = decide(spec(), status=started, summary=found, now=NOW)
    # The two that fit are kept (a gang that is not elastic would lose them) and the rest waited for.
    assert (waiting.action, waiting.delete_pods, waiting.create_indices) == (Action.CREATE, (), (2, 3))
    assert waiting.recheck_after == pytest.approx(50)
    later = decide(spec(), status=started, summary=found, now=NOW + timedelta(seconds=51))
    assert (later.action, later.members, later.reason) == (Action.RESIZE, (0, 1), c.REASON_SHRUNK)
    assert f"{JOB}-2: {quota}" in later.message
    below = decide(spec(minWorldSize=3), status=started, summary=found, now=NOW)
    assert below.delete_pods == (f"{JOB}-0", f"{JOB}-1")  # below it
    seen = summary([pod(0, "pending")], started).with_problems(refused)  # pod 1 created, not yet in the cache
    assert decide(spec(), status=started, summary=seen, now=NOW).delete_pods == ()
    # Shrunk: refused again, the two are waited for outside the gang, which is neither held up nor failed.
    shrunk = {**started, "phase": c.PHASE_RUNNING, "attempt": 1, STATUS_MEMBERS: [0, 1], "rendezvous": {"attempt": 1}}
    outside = summary([pod(0), pod(1)], shrunk).with_problems(refused)
    assert outside.problems == () and [p.index for p in outside.waiting.problems] == [2, 3]
    running = decide(spec(), status=shrunk, summary=outside, now=NOW + timedelta(hours=1))
    assert (running.action, running.create_indices, running.delete_pods) == (Action.CREATE, (2, 3), ())
    assert compute_status(spec(), status=shrunk, summary=outside, decision=running, now=NOW)["phase"] == c.PHASE_RUNNING


def test_below_the_minimum_the_job_waits_and_says_why() -> None:
    status = {**FORMED, "phase": c.PHASE_RESTARTING, "attempt": 1}
    pods = [pod(0), pod(1, "pending", attempt=1, unschedulable=FULL), pod(2, "pending", attempt=1, unschedulable=FULL),
            pod(3, "pending", attempt=1, unschedulable=FULL)]
    found = summary(pods, status)
    decision = decide(spec(), status=status, summary=found, now=NOW)
    assert decision.action == Action.WAIT and decision.members is None
    assert compute_status(spec(), status=status, summary=found, decision=decision, now=NOW)["reason"] == c.REASON_UNSCHEDULABLE


def test_ranks_that_run_again_are_taken_in_at_the_next_checkpoint() -> None:
    status = {**FORMED, "attempt": 2, STATUS_MEMBERS: [0, 1],
              "lastCheckpoint": {"step": 40, "uri": "s3://b/c", "time": "2025-01-02T01:59:00Z"}}
    pods = [pod(0), pod(1), pod(2, attempt=1), pod(3, attempt=1)]
    found = summary(pods, status)
    assert found.waiting.running == {2, 3}
    waiting = decide(spec(), status=status, summary=found, now=NOW)
    asked = {"since": rfc3339(NOW), "afterStep": 40}  # rank 0 is asked for a checkpoint past step 40
    assert waiting.action == Action.WAIT
    assert compute_status(spec(), status=status, summary=found, decision=waiting,
                          now=NOW)[STATUS_CHECKPOINT_REQUESTED] == asked
    status[STATUS_CHECKPOINT_REQUESTED] = asked
    later = decide(spec(), status=status, summary=found, now=NOW + timedelta(seconds=5))
    assert compute_status(spec(), status=status, summary=found, decision=later,
                          now=NOW)[STATUS_CHECKPOINT_REQUESTED] == asked  # kept as asked
    # Rank 0's clock is behind the operator's: its checkpoint's time is before the request, its step past it.
    status["lastCheckpoint"] = {"step": 41, "uri": "s3://b/c", "time": "2025-01-02T01:59:30Z"}
    decision = decide(spec(), status=status, summary=found, now=NOW)
    assert (decision.action, decision.attempt, decision.members, decision.reason) == (
        Action.RESIZE, 3, (0, 1, 2, 3), c.REASON_GROWN)
    assert "step 41" in decision.message
    patch = compute_status(spec(), status=status, summary=found, decision=decision, now=NOW)
    assert patch[STATUS_MEMBERS] == [0, 1, 2, 3] and patch[STATUS_WORLD_SIZE] == 4
    assert patch[STATUS_CHECKPOINT_REQUESTED] is None  # asked no more: cleared
    shrunk = get_condition(patch["conditions"], c.COND_SHRUNK)
    assert shrunk is not None and (shrunk["status"], shrunk["reason"]) == ("False", c.REASON_FULL_SIZE)
    assert ("Normal", c.REASON_GROWN, decision.message) in events_for(status, patch)


def test_a_job_without_a_checkpoint_grows_at_its_first_one() -> None:
    status = {**FORMED, "attempt": 2, STATUS_MEMBERS: [0, 1]}
    found = summary([pod(0), pod(1), pod(2, attempt=1), pod(3, attempt=1)], status)
    waiting = decide(spec(), status=status, summary=found, now=NOW)
    asked = compute_status(spec(), status=status, summary=found, decision=waiting, now=NOW)[STATUS_CHECKPOINT_REQUESTED]
    assert waiting.action == Action.WAIT and asked == {"since": rfc3339(NOW)}  # any checkpoint answers
    status[STATUS_CHECKPOINT_REQUESTED] = asked
    status["lastCheckpoint"] = {"step": 0, "uri": "s3://b/c", "time": "2025-01-01T00:00:00Z"}
    assert decide(spec(), status=status, summary=found, now=NOW).action == Action.RESIZE


def test_a_checkpoint_request_is_withdrawn_when_the_waiting_pods_stop_running() -> None:
    asked = {"since": rfc3339(NOW), "afterStep": 40}
    status = {**FORMED, "attempt": 2, STATUS_MEMBERS: [0, 1], STATUS_CHECKPOINT_REQUESTED: asked,
              "lastCheckpoint": {"step": 40, "uri": "s3://b/c", "time": "2025-01-02T01:59:00Z"}}
    found = summary([pod(0), pod(1)], status)  # the waiting pods are gone
    decision = decide(spec(), status=status, summary=found, now=NOW)
    assert compute_status(spec(), status=status, summary=found, decision=decision,
                          now=NOW)[STATUS_CHECKPOINT_REQUESTED] is None


def test_a_failure_restarts_the_gang_with_its_members_and_any_pod_ready_to_join() -> None:
    status = {**FORMED, "attempt": 2, STATUS_MEMBERS: [0, 1]}
    found = summary([pod(0), pod(1, "failed", attempt=2), pod(2, attempt=1), pod(3, "pending", attempt=1)], status)
    decision = decide(spec(), status=status, summary=found, now=NOW)
    assert (decision.action, decision.members) == (Action.RESTART, (0, 1, 2))
    assert decision.delete_pods == (f"{JOB}-1",)
    assert compute_status(spec(), status=status, summary=found, decision=decision, now=NOW)["restarts"] == 1


def test_the_job_succeeds_when_its_gang_did_and_the_waiting_pods_go() -> None:
    status = {**FORMED, "attempt": 1, STATUS_MEMBERS: [0, 1]}
    found = summary([pod(0, "succeeded"), pod(1, "succeeded"), pod(2, "pending", unschedulable=FULL)], status)
    decision = decide(spec(), status=status, summary=found, now=NOW)
    assert decision.action == Action.SUCCEED and "all 2 ranks exited 0" in decision.message
    after = decide(spec(), status={**status, "phase": c.PHASE_SUCCEEDED}, summary=found, now=NOW)
    assert after.delete_pods == (f"{JOB}-2",)


def test_a_member_gone_is_a_lost_rank_and_a_waiting_pod_gone_is_only_created_again() -> None:
    status = {**FORMED, "attempt": 1, STATUS_MEMBERS: [0, 1]}
    lost_waiting = decide(spec(), status=status, summary=summary([pod(0), pod(1), pod(2)], status), now=NOW)
    assert lost_waiting.action == Action.CREATE and lost_waiting.create_indices == (3,)
    lost_member = decide(spec(), status=status, summary=summary([pod(0), pod(2), pod(3)], status), now=NOW)
    assert lost_member.action == Action.RESTART and lost_member.failure is not None
    assert lost_member.failure.reason == c.REASON_RANK_MISSING and lost_member.failure.pod_index == 1


def test_a_job_that_is_not_elastic_records_its_world_size_and_no_members() -> None:
    plain = job_spec(worldSize=2)
    found = summarize_pods([pod(0), pod(1)], 0, job_name=JOB)
    patch = compute_status(plain, status={}, summary=found, decision=decide(plain, status={}, summary=found, now=NOW), now=NOW)
    assert patch[STATUS_WORLD_SIZE] == 2 and STATUS_MEMBERS not in patch and patch["ready"] == "2/2"


def test_a_gang_re_forming_takes_running_pods_in_at_once_when_none_is_still_starting() -> None:
    status = {**FORMED, "phase": c.PHASE_RESTARTING, "attempt": 2, STATUS_MEMBERS: [0, 1],
              "conditions": [{"type": c.COND_RESTARTING, "status": "True", "lastTransitionTime": rfc3339(NOW)}]}
    starting = pod(3, "pending", attempt=1, node="b")  # bound to a node, its container being created
    assert decide(spec(), status=status, summary=summary([pod(0), pod(1), pod(2, attempt=1), starting], status),
                  now=NOW).members is None
    unplaced = pod(3, "pending", attempt=1, unschedulable=FULL)  # will not come: no reason to wait for it
    grown = decide(spec(), status=status, summary=summary([pod(0), pod(1), pod(2, attempt=1), unplaced], status), now=NOW)
    assert grown.members == (0, 1, 2)


def test_recorded_members_are_the_gang_only_where_they_are_distinct_indices_of_the_jobs_pods() -> None:
    from ddp_operator.modes.elastic import members

    assert members(spec(), JobStatus.of({STATUS_MEMBERS: [2, 0]})) == (0, 2)
    for recorded in ([0, 4], [0, 0], [0, True], "0,1", [], None):  # 4 pods: index 4 is none of them
        assert members(spec(), JobStatus.of({STATUS_MEMBERS: recorded})) == (0, 1, 2, 3)
    assert members(job_spec(worldSize=4), JobStatus.of({STATUS_MEMBERS: [0, 1]})) == (0, 1, 2, 3)  # not elastic
