"""Restarting smart against a real API server: failure kinds, their budgets, deterministic bugs, hangs.

kwok plays the kubelet; the tests end containers with the exit codes and termination messages the
trainer runtime leaves (its failure line, ddp_contract.failureline).
"""

from __future__ import annotations

from ddp_contract.failureline import format_line
from ddp_operator import constants as c


def test_the_same_error_at_the_same_step_twice_fails_the_job_as_deterministic(jobs, kubectl) -> None:
    jobs.create("buggy", worldSize=2, backoffLimit=5)
    jobs.wait_phase("buggy", c.PHASE_RUNNING)
    error = "ZeroDivisionError: division by zero"
    jobs.finish("buggy-1", 1, "Error", message=f"Traceback ...\n{format_line(1, 57, 1, 'USER_ERROR', False, error)}")
    jobs.wait_pods("buggy", 2, attempt=1)
    restarted = jobs.wait_phase("buggy", c.PHASE_RUNNING)
    assert restarted["failedRank"]["step"] == 57 and restarted["failedRank"]["kind"] == c.KIND_PROGRAM

    # Attempt 1: another rank hits the same error at the same step.
    jobs.finish("buggy-0", 1, "Error", message=format_line(0, 57, 1, "USER_ERROR", False, error))
    status = jobs.wait_phase("buggy", c.PHASE_FAILED)
    assert status["reason"] == c.REASON_DETERMINISTIC and status["restarts"] == 1
    assert "at step 57: ZeroDivisionError: division by zero" in status["message"]
    assert "attempt 0 failed with the same error at the same step" in status["message"]
    header, row = kubectl("get", "ddpjobs", "buggy", "-n", jobs.namespace).stdout.splitlines()
    at = header.index("REASON")
    assert row[at:].split()[0] == c.REASON_DETERMINISTIC, (header, row)


def test_a_hung_rank_restarts_the_gang_with_reason_hung_on_the_infrastructure_budget(jobs) -> None:
    jobs.create("stuck", worldSize=2, backoffLimit=0)
    jobs.wait_phase("stuck", c.PHASE_RUNNING)
    where = "s3://results/team/stuck/hangs/attempt-0/rank-1.txt"
    jobs.hang("stuck-1", 1, 40, where)
    jobs.wait_pods("stuck", 2, attempt=1)
    status = jobs.wait_phase("stuck", c.PHASE_RUNNING)
    assert (status["programRestarts"], status["infrastructureRestarts"], status["restarts"]) == (0, 1, 1)
    assert status["failedRank"]["reason"] == c.REASON_HUNG and status["failedRank"]["kind"] == c.KIND_INFRASTRUCTURE
    hung = [e for e in jobs.events("stuck") if e.reason == c.REASON_HUNG]
    assert hung and hung[0].type == "Warning" and where in hung[0].message, [e.message for e in hung]


def test_evictions_are_retried_within_their_own_budget_and_fail_the_job_beyond_it(jobs) -> None:
    jobs.create("preempted", worldSize=2, backoffLimit=0, infrastructureBackoffLimit=2)
    for attempt in (1, 2):
        jobs.wait_phase("preempted", c.PHASE_RUNNING)
        jobs.evict(f"preempted-{attempt % 2}")
        jobs.wait_pods("preempted", 2, attempt=attempt)
    jobs.wait_phase("preempted", c.PHASE_RUNNING)
    jobs.evict("preempted-1")
    status = jobs.wait_phase("preempted", c.PHASE_FAILED)
    assert status["reason"] == c.REASON_BACKOFF_LIMIT
    assert "infrastructureBackoffLimit 2 reached after 2 infrastructure restarts" in status["message"]
    assert (status["programRestarts"], status["infrastructureRestarts"]) == (0, 2)
