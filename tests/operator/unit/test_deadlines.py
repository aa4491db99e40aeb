"""activeDeadlineSeconds and ttlSecondsAfterFinished."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from ddp_contract.resource import JobStatus
from ddp_contract.timestamps import rfc3339
from ddp_operator.deadlines import deadline_exceeded, requeue_after, ttl_expired
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
