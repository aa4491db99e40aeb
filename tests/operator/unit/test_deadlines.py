"""activeDeadlineSeconds and ttlSecondsAfterFinished."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ddp_contract.resource import JobStatus
from ddp_contract.timestamps import rfc3339
from ddp_operator import constants as c
from ddp_operator.deadlines import (
    deadline_exceeded,
    deadline_remaining,
    left_of,
    requeue_after,
    startup_remaining,
    ttl_expired,
    ttl_remaining,
)
from ddp_operator.spec import MAX_SECONDS
from podfixtures import NOW, job_spec


@pytest.mark.parametrize(
    ("deadline", "started", "phase", "expected"),
    [
        (60, 61, "Running", True),
        (60, 60, "Running", True),
        (60, 59, "Running", False),
        (None, 10_000, "Running", False),
        (60, None, "Suspended", False),
        (60, 61, "Succeeded", False),
    ],
)
def test_deadline_exceeded(deadline: int | None, started: int | None, phase: str, expected: bool) -> None:
    status: dict[str, Any] = {"phase": phase}
    if started is not None:
        status["startTime"] = rfc3339(NOW - timedelta(seconds=started))
    spec = job_spec(**({"activeDeadlineSeconds": deadline} if deadline else {}))
    assert deadline_exceeded(JobStatus.of(status), spec, NOW) is expected


@pytest.mark.parametrize(
    ("ttl", "finished", "phase", "expected"),
    [
        (0, 0, "Succeeded", True),
        (100, 101, "Failed", True),
        (100, 99, "Succeeded", False),
        (None, 10_000, "Succeeded", False),
        (0, None, "Succeeded", False),
        (0, 5, "Running", False),
    ],
)
def test_ttl_expired(ttl: int | None, finished: int | None, phase: str, expected: bool) -> None:
    status: dict[str, Any] = {"phase": phase}
    if finished is not None:
        status["completionTime"] = rfc3339(NOW - timedelta(seconds=finished))
    spec = job_spec(**({"ttlSecondsAfterFinished": ttl} if ttl is not None else {}))
    assert ttl_expired(JobStatus.of(status), spec, NOW) is expected


def test_requeue_after_is_the_nearest_due_time() -> None:
    spec = job_spec(activeDeadlineSeconds=100, ttlSecondsAfterFinished=30)
    assert requeue_after(JobStatus.of({"phase": "Running", "startTime": rfc3339(NOW - timedelta(seconds=40))}), spec, NOW) == 60
    assert (
        requeue_after(JobStatus.of({"phase": "Failed", "completionTime": rfc3339(NOW - timedelta(seconds=50))}), spec, NOW) == 0
    )
    assert requeue_after(JobStatus.of({"phase": "Running"}), spec, NOW) is None


def test_the_longest_deadlines_the_spec_takes_are_counted_without_leaving_the_calendar() -> None:
    """Each deadline at spec.MAX_SECONDS (68 years) from a start in the year 9990: the date it falls on lies
    past datetime's last year, and the seconds left are still counted."""
    longest = job_spec(activeDeadlineSeconds=MAX_SECONDS, ttlSecondsAfterFinished=MAX_SECONDS,
                       startupDeadlineSeconds=MAX_SECONDS)
    late = datetime(9990, 1, 1, tzinfo=UTC)
    now = late + timedelta(seconds=10)
    running = JobStatus.of({"phase": "Running", "startTime": rfc3339(late), "conditions": [
        {"type": c.COND_RANKS_BLOCKED, "status": "True", "lastTransitionTime": rfc3339(late)}]})
    assert deadline_remaining(running, longest, now) == startup_remaining(running, longest, now) == MAX_SECONDS - 10
    assert not deadline_exceeded(running, longest, now) and requeue_after(running, longest, now) == MAX_SECONDS - 10
    done = JobStatus.of({"phase": "Succeeded", "completionTime": rfc3339(late)})
    assert ttl_remaining(done, longest, now) == MAX_SECONDS - 10 and not ttl_expired(done, longest, now)


def test_left_of_counts_any_number_of_seconds() -> None:
    assert left_of(2**40, NOW - timedelta(seconds=5), NOW) == 2**40 - 5
    assert left_of(60, NOW - timedelta(days=2), NOW) == 60 - 2 * 86400
