"""decide: create, wait, restart, fail, succeed, suspend."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from ddp_contract.exitcodes import ExitCode
from ddp_contract.failureline import format_line
from ddp_contract.resource import JobStatus
from ddp_contract.timestamps import rfc3339
from ddp_operator import constants as c
from ddp_operator.deadlines import requeue_after
from ddp_operator.decision import Action, Decision, decide
from ddp_operator.failures import ECHO_GRACE_SECONDS, RENDEZVOUS_ECHO_GRACE_SECONDS, PodProblem, RankFailure
from ddp_operator.podsummary import summarize_pods
from ddp_operator.statuspatch import set_condition
from podfixtures import NOW, job_spec, pod, summary_of


def test_new_job_creates_every_rank() -> None:
    decision = decide(job_spec(worldSize=3), status={}, summary=summary_of(), now=NOW)
    assert decision.action == Action.CREATE and decision.create_indices == (0, 1, 2) and decision.attempt == 0


def test_only_missing_ranks_are_created() -> None:
    decision = decide(job_spec(worldSize=3), status={"phase": "Pending"}, summary=summary_of(pod(1, "pending")), now=NOW)
    assert decision.create_indices == (0, 2)


def test_all_ranks_present_waits() -> None:
    decision = decide(job_spec(), status={"phase": "Running"}, summary=summary_of(pod(0), pod(1)), now=NOW)
    assert decision == Decision(Action.WAIT, 0)


def test_old_attempt_pods_are_deleted_and_their_ranks_wait_for_the_name() -> None:
    summary = summary_of(pod(0, "running", attempt=0), pod(1, "running", attempt=0, deleting=True), attempt=1)
    decision = decide(job_spec(), status={"phase": "Restarting", "attempt": 1, "restarts": 1}, summary=summary, now=NOW)
    assert decision.action == Action.WAIT
    assert decision.delete_pods == ("mnist-0",) and decision.create_indices == ()


def test_after_the_old_gang_is_gone_the_new_attempt_is_created() -> None:
    decision = decide(job_spec(), status={"phase": "Restarting", "attempt": 1, "restarts": 1}, summary=summary_of(attempt=1),
                      now=NOW)
    assert decision.action == Action.CREATE and decision.create_indices == (0, 1) and decision.attempt == 1


def test_all_ranks_succeeded_succeeds() -> None:
    decision = decide(job_spec(), status={"phase": "Running"}, summary=summary_of(pod(0, "succeeded"), pod(1, "succeeded")),
                      now=NOW)
    assert decision.action == Action.SUCCEED and decision.reason == c.REASON_SUCCEEDED


def test_rank_zero_alone_succeeding_is_not_success() -> None:
    decision = decide(job_spec(), status={"phase": "Running"}, summary=summary_of(pod(0, "succeeded"), pod(1)), now=NOW)
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
    decision = decide(job_spec(restartPolicy=policy), status={"phase": "Running", "restarts": 0}, summary=summary, now=NOW)
    assert decision.action == action and decision.reason == decision_reason
    assert decision.failure is not None and decision.failure.pod_index == 1
    assert "rank 1 (pod mnist-1)" in decision.message
    if exit_code is not None:
        assert f"code {exit_code}" in decision.message


@pytest.mark.parametrize(
    ("restarts", "limit", "action"), [(2, 3, Action.RESTART), (3, 3, Action.FAIL), (0, 0, Action.FAIL)]
)
def test_backoff_limit(restarts: int, limit: int, action: Action) -> None:
    summary = summary_of(pod(0), pod(1, "failed", exit_code=1))
    status = {"phase": "Running", "restarts": restarts, "programRestarts": restarts}
    decision = decide(job_spec(backoffLimit=limit), status=status, summary=summary, now=NOW)
    assert decision.action == action
    if action == Action.FAIL:
        assert decision.reason == c.REASON_BACKOFF_LIMIT
        assert "exited with code 1" in decision.message and "mnist-1" in decision.message
        assert decision.delete_pods == ("mnist-0",)  # the survivor stops; the failed pod stays for its logs


def test_rank_lost_after_the_gang_formed_restarts_it() -> None:
    decision = decide(job_spec(), status={"phase": "Running", "attempt": 0}, summary=summary_of(pod(0)), now=NOW)
    assert decision.action == Action.RESTART and decision.reason == c.REASON_RANK_EVICTED
    assert decision.failure == RankFailure(1, "mnist-1", None, c.REASON_RANK_MISSING, True, attempt=0)


def test_a_lost_rank_names_its_attempt_and_the_node_its_pod_was_last_seen_on() -> None:
    summary = replace(summary_of(pod(0, attempt=2), attempt=2), nodes_seen={"mnist-0": "node-a", "mnist-1": "node-b"})
    failure = decide(job_spec(), status={"phase": "Running", "attempt": 2}, summary=summary, now=NOW).failure
    assert failure is not None and failure.reason == c.REASON_RANK_MISSING
    assert failure.as_status() | {"message": None} == {
        "rank": 1, "pod": "mnist-1", "node": "node-b", "exitCode": None, "signal": None, "oomKilled": False,
        "reason": c.REASON_RANK_MISSING, "message": None, "kind": c.KIND_INFRASTRUCTURE, "attempt": 2, "step": None}


def test_rank_being_deleted_after_the_gang_formed_restarts_it() -> None:
    decision = decide(job_spec(), status={"phase": "Running"}, summary=summary_of(pod(0), pod(1, deleting=True)), now=NOW)
    assert decision.action == Action.RESTART and decision.failure is not None and decision.failure.pod_index == 1


def test_rank_lost_before_the_gang_formed_is_just_recreated() -> None:
    decision = decide(job_spec(), status={"phase": "Starting"}, summary=summary_of(pod(0)), now=NOW)
    assert decision.action == Action.CREATE and decision.create_indices == (1,)


def test_a_rank_on_a_lost_node_restarts_the_gang_as_node_lost_even_before_it_formed() -> None:
    lost = {"gpu-2": "node gpu-2 was deleted at 2025-01-02T03:04:00Z"}
    summary = summarize_pods([pod(0, node="gpu-1"), pod(1, node="gpu-2")], 0, job_name="mnist", lost_nodes=lost)
    decision = decide(job_spec(restartPolicy="ExitCode"), status={"phase": "Starting"}, summary=summary, now=NOW)
    assert decision.action == Action.RESTART and decision.reason == c.REASON_NODE_LOST
    assert decision.message.startswith("rank 1 (pod mnist-1 on node gpu-2) was lost: NodeLost (node gpu-2 was deleted")
    assert decision.delete_pods == ("mnist-0", "mnist-1") and decision.attempt == 1


def test_suspend_deletes_every_pod() -> None:
    summary = summary_of(pod(0), pod(1, "succeeded"), pod(2, attempt=3))
    decision = decide(job_spec(worldSize=3, suspend=True), status={"phase": "Running"}, summary=summary, now=NOW)
    assert decision.action == Action.SUSPEND and decision.delete_pods == ("mnist-0", "mnist-1", "mnist-2")


def test_resume_recreates_once_pods_are_gone() -> None:
    spec = job_spec()
    assert decide(spec, status={"phase": "Suspended"}, summary=summary_of(pod(0, deleting=True)), now=NOW).create_indices == (1,)
    assert decide(spec, status={"phase": "Suspended"}, summary=summary_of(), now=NOW).create_indices == (0, 1)


def test_deadline_fails_and_stops_running_ranks() -> None:
    status = {"phase": "Running", "startTime": rfc3339(NOW - timedelta(seconds=61))}
    decision = decide(job_spec(activeDeadlineSeconds=60), status=status, summary=summary_of(pod(0), pod(1, "pending")), now=NOW)
    assert decision.action == Action.FAIL and decision.reason == c.REASON_DEADLINE
    assert decision.delete_pods == ("mnist-0", "mnist-1")
    assert "activeDeadlineSeconds=60" in decision.message


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_finished_jobs_only_stop_leftovers(phase: str) -> None:
    status = {"phase": phase, "reason": "R", "message": "M"}
    decision = decide(job_spec(suspend=True), status=status, summary=summary_of(pod(0), pod(1, "failed")), now=NOW)
    assert decision == Decision(Action.WAIT, 0, "R", "M", delete_pods=("mnist-0",))


def blocked_since(seconds_ago: float) -> dict[str, Any]:
    """A status whose ranks have been held up for `seconds_ago`."""
    since = NOW - timedelta(seconds=seconds_ago)
    conditions = set_condition([], c.COND_RANKS_BLOCKED, status=True, reason="Unschedulable",
                               message="ranks 0-1 (Unschedulable): no", now=since)
    return {"phase": "Pending", "conditions": conditions}


def test_ranks_held_up_past_the_startup_deadline_fail_the_job_with_the_cause() -> None:
    spec = job_spec(startupDeadlineSeconds=600)
    held = summary_of(pod(0, "pending", unschedulable="0/4 nodes are available"), pod(1, "running"))
    early = decide(spec, status=blocked_since(599), summary=held, now=NOW)
    assert early.action == Action.WAIT and requeue_after(JobStatus.of(blocked_since(599)), spec, NOW) == pytest.approx(1)
    late = decide(spec, status=blocked_since(600), summary=held, now=NOW)
    assert late.action == Action.FAIL and late.reason == "Unschedulable"
    assert late.message == ("rank 0 (Unschedulable): 0/4 nodes are available; "
                            "still so after startupDeadlineSeconds=600")
    assert late.delete_pods == ("mnist-0", "mnist-1")  # the other ranks free what they hold


def test_the_startup_deadline_needs_ranks_held_up_now() -> None:
    spec = job_spec(startupDeadlineSeconds=60)
    # The condition is stale (it says held up long ago) but every rank runs now: nothing fails.
    assert decide(spec, status=blocked_since(3600), summary=summary_of(pod(0), pod(1)), now=NOW).action == Action.WAIT
    assert decide(spec, status={"phase": "Pending"}, summary=summary_of(pod(0, "pending", unschedulable="x")), now=NOW).action \
        == Action.CREATE


def runtime_failure(rank: int, step: int | None, error: str, code: int = 1, attempt: int = 1) -> dict[str, Any]:
    """A failed rank's pod whose termination message ends with the runtime's failure line."""
    line = format_line(rank, step, code, "USER_ERROR", False, error)
    return pod(rank, "failed", exit_code=code, output=f"Traceback ...\n{line}", attempt=attempt)


@pytest.mark.parametrize(
    ("exit_code", "reason", "kind", "decision_reason"),
    [
        (1, None, c.KIND_PROGRAM, c.REASON_RANK_FAILED),
        (139, None, c.KIND_PROGRAM, c.REASON_RANK_FAILED),  # SIGSEGV: the program's
        (137, "OOMKilled", c.KIND_PROGRAM, c.REASON_RANK_FAILED),
        (137, "Error", c.KIND_INFRASTRUCTURE, c.REASON_RANK_FAILED),  # SIGKILL from outside
        (143, None, c.KIND_INFRASTRUCTURE, c.REASON_RANK_FAILED),
        (ExitCode.HUNG, None, c.KIND_INFRASTRUCTURE, c.REASON_HUNG),
        (ExitCode.COMMUNICATION_ERROR, None, c.KIND_INFRASTRUCTURE, c.REASON_RANK_FAILED),
    ],
)
def test_each_failure_draws_on_the_budget_of_its_kind(exit_code: int, reason: str | None, kind: str,
                                                      decision_reason: str) -> None:
    # The program's budget is spent; the infrastructure's is not.
    status = {"phase": "Running", "restarts": 3, "programRestarts": 3, "infrastructureRestarts": 0}
    summary = summary_of(pod(0), pod(1, "failed", exit_code=exit_code, reason=reason))
    decision = decide(job_spec(backoffLimit=3), status=status, summary=summary, now=NOW)
    assert decision.failure is not None and decision.failure.kind == kind
    if kind == c.KIND_PROGRAM:
        assert decision.action == Action.FAIL and decision.reason == c.REASON_BACKOFF_LIMIT
        assert "backoffLimit 3 reached after 3 program restarts" in decision.message
    else:
        assert decision.action == Action.RESTART and decision.reason == decision_reason
        assert "infrastructure restart 1 of 10, infrastructureBackoffLimit" in decision.message


def test_evictions_beyond_the_infrastructure_budget_fail_the_job() -> None:
    status = {"phase": "Running", "restarts": 2, "infrastructureRestarts": 2}
    summary = summary_of(pod(0), pod(1, "evicted", reason="Evicted"))
    decision = decide(job_spec(infrastructureBackoffLimit=2), status=status, summary=summary, now=NOW)
    assert decision.action == Action.FAIL and decision.reason == c.REASON_BACKOFF_LIMIT
    assert "infrastructureBackoffLimit 2 reached after 2 infrastructure restarts" in decision.message


def test_the_same_error_at_the_same_step_on_consecutive_attempts_fails_at_once() -> None:
    error = "ZeroDivisionError: division by zero"
    first = decide(job_spec(), status={"phase": "Running", "attempt": 0},
                   summary=summary_of(pod(0), runtime_failure(1, 120, error, attempt=0)), now=NOW)
    assert first.action == Action.RESTART and first.failure is not None
    assert "at step 120: ZeroDivisionError: division by zero" in first.message
    status = {"phase": "Running", "attempt": 1, "restarts": 1, "programRestarts": 1,
              "failedRank": first.failure.as_status()}
    # Another rank, the same error at the same step: deterministic.
    again = decide(job_spec(), status=status, summary=summary_of(runtime_failure(0, 120, error), pod(1, attempt=1), attempt=1),
                   now=NOW)
    assert again.action == Action.FAIL and again.reason == c.REASON_DETERMINISTIC
    assert "attempt 0 failed with the same error at the same step" in again.message
    # The same error at another step, or another error at the same step: retried.
    for other in (runtime_failure(1, 121, error), runtime_failure(1, 120, "KeyError: 'x'")):
        retried = decide(job_spec(), status=status, summary=summary_of(pod(0, attempt=1), other, attempt=1), now=NOW)
        assert retried.action == Action.RESTART, retried.message
    # Not consecutive: the attempt in between failed for another cause.
    stale = {**status, "attempt": 2, "failedRank": {**first.failure.as_status(), "attempt": 0}}
    later = decide(job_spec(), status=stale, summary=summary_of(runtime_failure(0, 120, error, attempt=2), attempt=2), now=NOW)
    assert later.action == Action.RESTART


def test_a_broken_collective_waits_briefly_for_the_peer_whose_death_caused_it() -> None:
    finished = rfc3339(NOW)
    echo = pod(0, "failed", exit_code=ExitCode.COMMUNICATION_ERROR, finished_at=finished)
    alone = decide(job_spec(), status={"phase": "Running"}, summary=summary_of(echo, pod(1)), now=NOW + timedelta(seconds=1))
    assert alone.action == Action.WAIT and alone.recheck_after == pytest.approx(ECHO_GRACE_SECONDS - 1)
    # The cause shows up (in the same second): it is the failure, whatever the order of the ranks.
    cause = runtime_failure(1, 3, "ValueError: boom", attempt=0)
    both = decide(job_spec(), status={"phase": "Running"}, summary=summary_of(echo, cause), now=NOW + timedelta(seconds=1))
    assert both.action == Action.RESTART and both.failure is not None and both.failure.pod_index == 1
    # No cause ever shows up (the network broke): the collective's failure is acted on.
    late = decide(job_spec(), status={"phase": "Running"}, summary=summary_of(echo, pod(1)), now=NOW + timedelta(seconds=4))
    assert late.action == Action.RESTART and late.failure is not None and late.failure.pod_index == 0
    assert late.failure.kind == c.KIND_INFRASTRUCTURE


def test_rank_0_s_rendezvous_timeout_waits_for_the_rank_that_could_not_join_and_names_it() -> None:
    """Rank 0 holds the store: its rendezvous times out because another rank could not join, and
    that rank (whose own wait for rank 0's port ends a little later, on its own clock) is named."""
    finished = rfc3339(NOW)
    server = pod(0, "failed", exit_code=ExitCode.RENDEZVOUS_FAILED, finished_at=finished, node="gpu-1")
    alone = decide(job_spec(), status={"phase": "Starting"}, summary=summary_of(server, pod(1)), now=NOW + timedelta(seconds=10))
    assert alone.action == Action.WAIT and alone.recheck_after == pytest.approx(RENDEZVOUS_ECHO_GRACE_SECONDS - 10)
    later = rfc3339(NOW + timedelta(seconds=20))
    cut_off = pod(1, "failed", exit_code=ExitCode.RENDEZVOUS_FAILED, finished_at=later, node="gpu-7")
    both = decide(job_spec(), status={"phase": "Starting"}, summary=summary_of(server, cut_off), now=NOW + timedelta(seconds=21))
    assert both.action == Action.RESTART and both.failure is not None
    assert (both.failure.pod_index, both.failure.node) == (1, "gpu-7")
    # No other rank ever fails (it never started): rank 0's timeout is acted on.
    late = decide(job_spec(), status={"phase": "Starting"}, summary=summary_of(server, pod(1, "pending")),
                  now=NOW + timedelta(seconds=RENDEZVOUS_ECHO_GRACE_SECONDS + 1))
    assert late.action == Action.RESTART and late.failure is not None and late.failure.pod_index == 0


def test_ranks_the_cluster_s_rules_refused_fail_the_job_at_once_naming_them() -> None:
    said = 'the API server refused the pod: violates PodSecurity "restricted:latest": runAsNonRoot != true'
    refused = summary_of(pod(2, "running")).with_problems([PodProblem(r, c.REASON_POD_SECURITY, said) for r in (0, 1)])
    decision = decide(job_spec(worldSize=3), status={"phase": "Pending"}, summary=refused, now=NOW)
    assert decision.action == Action.FAIL and decision.reason == c.REASON_POD_SECURITY
    assert decision.message == f"ranks 0-1 (PodSecurity): {said}" and decision.delete_pods == ("mnist-2",)


def test_a_partial_gang_a_quota_refused_is_deleted_then_created_whole() -> None:
    said = "ResourceQuota team cannot hold the whole gang"
    spec, status = job_spec(worldSize=3), {"phase": "Starting"}
    partial = summary_of(pod(0, "running")).with_problems([PodProblem(r, c.REASON_QUOTA_EXCEEDED, said) for r in (1, 2)])
    freed = decide(spec, status=status, summary=partial, now=NOW)
    assert freed.action == Action.WAIT and freed.delete_pods == ("mnist-0",)
    gone = summary_of().with_problems([PodProblem(r, c.REASON_QUOTA_EXCEEDED, said) for r in (0, 1, 2)])
    again = decide(spec, status=status, summary=gone, now=NOW)
    assert again.action == Action.CREATE and again.create_indices == (0, 1, 2)
