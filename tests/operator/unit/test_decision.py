"""decide: create, wait, restart, fail, succeed, suspend."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from ddp_contract.timestamps import rfc3339
from ddp_operator import constants as c
from ddp_operator.deadlines import requeue_after
from ddp_operator.decision import Action, Decision, decide
from ddp_operator.podsummary import RankFailure
from ddp_operator.statuspatch import set_condition
from podfixtures import NOW, job_spec, pod, summary_of


def test_new_job_creates_every_rank() -> None:
    decision = decide(job_spec(worldSize=3), {}, summary_of(), NOW)
    assert decision.action == Action.CREATE and decision.create_ranks == (0, 1, 2) and decision.attempt == 0


def test_only_missing_ranks_are_created() -> None:
    decision = decide(job_spec(worldSize=3), {"phase": "Pending"}, summary_of(pod(1, "pending")), NOW)
    assert decision.create_ranks == (0, 2)


def test_all_ranks_present_waits() -> None:
    decision = decide(job_spec(), {"phase": "Running"}, summary_of(pod(0), pod(1)), NOW)
    assert decision == Decision(Action.WAIT, 0)


def test_old_attempt_pods_are_deleted_and_their_ranks_wait_for_the_name() -> None:
    summary = summary_of(pod(0, "running", attempt=0), pod(1, "running", attempt=0, deleting=True), attempt=1)
    decision = decide(job_spec(), {"phase": "Restarting", "attempt": 1, "restarts": 1}, summary, NOW)
    assert decision.action == Action.WAIT
    assert decision.delete_pods == ("mnist-0",) and decision.create_ranks == ()


def test_after_the_old_gang_is_gone_the_new_attempt_is_created() -> None:
    decision = decide(job_spec(), {"phase": "Restarting", "attempt": 1, "restarts": 1}, summary_of(attempt=1), NOW)
    assert decision.action == Action.CREATE and decision.create_ranks == (0, 1) and decision.attempt == 1


def test_all_ranks_succeeded_succeeds() -> None:
    decision = decide(job_spec(), {"phase": "Running"}, summary_of(pod(0, "succeeded"), pod(1, "succeeded")), NOW)
    assert decision.action == Action.SUCCEED and decision.reason == c.REASON_SUCCEEDED


def test_rank_zero_alone_succeeding_is_not_success() -> None:
    decision = decide(job_spec(), {"phase": "Running"}, summary_of(pod(0, "succeeded"), pod(1)), NOW)
    assert decision.action == Action.WAIT


@pytest.mark.parametrize(
    ("policy", "state", "exit_code", "reason", "action", "decision_reason"),
    [
        ("OnFailure", "failed", 1, None, Action.RESTART, c.REASON_RANK_FAILED),
        ("OnFailure", "evicted", None, "Evicted", Action.RESTART, c.REASON_RANK_EVICTED),
        ("Never", "failed", 137, None, Action.FAIL, c.REASON_PERMANENT),
        ("Never", "evicted", None, "NodeLost", Action.FAIL, c.REASON_PERMANENT),
        ("ExitCode", "failed", 2, None, Action.FAIL, c.REASON_PERMANENT),
        ("ExitCode", "failed", 137, "OOMKilled", Action.RESTART, c.REASON_RANK_FAILED),
        ("ExitCode", "evicted", None, "Preempted", Action.RESTART, c.REASON_RANK_EVICTED),
    ],
)
def test_failed_rank_by_policy(
    policy: str, state: str, exit_code: int | None, reason: str | None, action: Action, decision_reason: str
) -> None:
    summary = summary_of(pod(0), pod(1, state, exit_code=exit_code, reason=reason))
    decision = decide(job_spec(restartPolicy=policy), {"phase": "Running", "restarts": 0}, summary, NOW)
    assert decision.action == action and decision.reason == decision_reason
    assert decision.failure is not None and decision.failure.rank == 1
    assert "rank 1 (pod mnist-1)" in decision.message
    if exit_code is not None:
        assert f"code {exit_code}" in decision.message


def test_gang_restart_deletes_every_pod_and_bumps_the_attempt() -> None:
    summary = summary_of(pod(0), pod(1, "failed"), pod(2, "succeeded"), pod(3, "running", attempt=7))
    decision = decide(job_spec(worldSize=3), {"phase": "Running", "restarts": 1, "attempt": 0}, summary, NOW)
    assert decision.action == Action.RESTART and decision.attempt == 1
    assert decision.delete_pods == ("mnist-0", "mnist-1", "mnist-2", "mnist-3")
    assert "restart 2 of 3" in decision.message


@pytest.mark.parametrize(
    ("restarts", "limit", "action"), [(2, 3, Action.RESTART), (3, 3, Action.FAIL), (0, 0, Action.FAIL)]
)
def test_backoff_limit(restarts: int, limit: int, action: Action) -> None:
    summary = summary_of(pod(0), pod(1, "failed", exit_code=1))
    decision = decide(job_spec(backoffLimit=limit), {"phase": "Running", "restarts": restarts}, summary, NOW)
    assert decision.action == action
    if action == Action.FAIL:
        assert decision.reason == c.REASON_BACKOFF_LIMIT
        assert "exited with code 1" in decision.message and "mnist-1" in decision.message
        assert decision.delete_pods == ("mnist-0",)  # the survivor stops; the failed pod stays for its logs


def test_rank_lost_after_the_gang_formed_restarts_it() -> None:
    decision = decide(job_spec(), {"phase": "Running", "attempt": 0}, summary_of(pod(0)), NOW)
    assert decision.action == Action.RESTART and decision.reason == c.REASON_RANK_EVICTED
    assert decision.failure == RankFailure(1, "mnist-1", None, c.REASON_RANK_MISSING, True)


def test_rank_being_deleted_after_the_gang_formed_restarts_it() -> None:
    decision = decide(job_spec(), {"phase": "Running"}, summary_of(pod(0), pod(1, deleting=True)), NOW)
    assert decision.action == Action.RESTART and decision.failure is not None and decision.failure.rank == 1


def test_rank_lost_before_the_gang_formed_is_just_recreated() -> None:
    decision = decide(job_spec(), {"phase": "Starting"}, summary_of(pod(0)), NOW)
    assert decision.action == Action.CREATE and decision.create_ranks == (1,)


def test_suspend_deletes_every_pod() -> None:
    summary = summary_of(pod(0), pod(1, "succeeded"), pod(2, attempt=3))
    decision = decide(job_spec(worldSize=3, suspend=True), {"phase": "Running"}, summary, NOW)
    assert decision.action == Action.SUSPEND and decision.delete_pods == ("mnist-0", "mnist-1", "mnist-2")


def test_resume_recreates_once_pods_are_gone() -> None:
    spec = job_spec()
    assert decide(spec, {"phase": "Suspended"}, summary_of(pod(0, deleting=True)), NOW).create_ranks == (1,)
    assert decide(spec, {"phase": "Suspended"}, summary_of(), NOW).create_ranks == (0, 1)


def test_deadline_fails_and_stops_running_ranks() -> None:
    status = {"phase": "Running", "startTime": rfc3339(NOW - timedelta(seconds=61))}
    decision = decide(job_spec(activeDeadlineSeconds=60), status, summary_of(pod(0), pod(1, "pending")), NOW)
    assert decision.action == Action.FAIL and decision.reason == c.REASON_DEADLINE
    assert decision.delete_pods == ("mnist-0", "mnist-1")
    assert "activeDeadlineSeconds=60" in decision.message


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_finished_jobs_only_stop_leftovers(phase: str) -> None:
    status = {"phase": phase, "reason": "R", "message": "M"}
    decision = decide(job_spec(suspend=True), status, summary_of(pod(0), pod(1, "failed")), NOW)
    assert decision == Decision(Action.WAIT, 0, "R", "M", delete_pods=("mnist-0",))


def blocked_since(seconds_ago: float) -> dict[str, Any]:
    """A status whose ranks have been held up for `seconds_ago`."""
    since = NOW - timedelta(seconds=seconds_ago)
    conditions = set_condition([], c.COND_RANKS_BLOCKED, True, "Unschedulable", "ranks 0-1 (Unschedulable): no", since)
    return {"phase": "Pending", "conditions": conditions}


def test_ranks_held_up_past_the_startup_deadline_fail_the_job_with_the_cause() -> None:
    spec = job_spec(startupDeadlineSeconds=600)
    held = summary_of(pod(0, "pending", unschedulable="0/4 nodes are available"), pod(1, "running"))
    early = decide(spec, blocked_since(599), held, NOW)
    assert early.action == Action.WAIT and requeue_after(blocked_since(599), spec, NOW) == pytest.approx(1)
    late = decide(spec, blocked_since(600), held, NOW)
    assert late.action == Action.FAIL and late.reason == "Unschedulable"
    assert late.message == ("rank 0 (Unschedulable): 0/4 nodes are available; "
                            "still so after startupDeadlineSeconds=600")
    assert late.delete_pods == ("mnist-0", "mnist-1")  # the other ranks free what they hold


def test_the_startup_deadline_needs_ranks_held_up_now() -> None:
    spec = job_spec(startupDeadlineSeconds=60)
    # The condition is stale (it says held up long ago) but every rank runs now: nothing fails.
    assert decide(spec, blocked_since(3600), summary_of(pod(0), pod(1)), NOW).action == Action.WAIT
    assert decide(spec, {"phase": "Pending"}, summary_of(pod(0, "pending", unschedulable="x")), NOW).action \
        == Action.CREATE
