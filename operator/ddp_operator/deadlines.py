"""activeDeadlineSeconds and ttlSecondsAfterFinished: when each falls due."""

from __future__ import annotations

from datetime import datetime

from ddp_contract.jobspec import JobSpec
from ddp_contract.resource import JobStatus
from ddp_contract.timestamps import parse_rfc3339
from ddp_operator import constants as c


def left_of(seconds: float, since: datetime, now: datetime) -> float:
    """Seconds left of `seconds` counted from `since`. Counted from the time passed, never as a date:
    `since` plus the seconds may lie past the calendar's end (the year 9999)."""
    return seconds - (now - since).total_seconds()


def deadline_exceeded(status: JobStatus, spec: JobSpec, now: datetime) -> bool:
    """activeDeadlineSeconds counts from status.startTime, which suspension clears (as for batch Jobs)."""
    remaining = deadline_remaining(status, spec, now)
    return remaining is not None and remaining <= 0


def deadline_remaining(status: JobStatus, spec: JobSpec, now: datetime) -> float | None:
    start = parse_rfc3339(status.start_time)
    if spec.active_deadline_seconds is None or start is None or status.phase in c.TERMINAL_PHASES:
        return None
    return left_of(spec.active_deadline_seconds, start, now)


def ttl_expired(status: JobStatus, spec: JobSpec, now: datetime) -> bool:
    """Whether a finished job should now be deleted (ttlSecondsAfterFinished after completionTime)."""
    remaining = ttl_remaining(status, spec, now)
    return remaining is not None and remaining <= 0


def ttl_remaining(status: JobStatus, spec: JobSpec, now: datetime) -> float | None:
    done = parse_rfc3339(status.completion_time)
    if spec.ttl_seconds_after_finished is None or done is None or status.phase not in c.TERMINAL_PHASES:
        return None
    return left_of(spec.ttl_seconds_after_finished, done, now)


def startup_remaining(status: JobStatus, spec: JobSpec, now: datetime) -> float | None:
    """Seconds left before ranks held up (condition RanksBlocked True, since its lastTransitionTime)
    fail the job; None while no rank is held up."""
    blocked = status.condition(c.COND_RANKS_BLOCKED)
    since = parse_rfc3339((blocked or {}).get("lastTransitionTime"))
    if blocked is None or blocked.get("status") != "True" or since is None or status.phase in c.TERMINAL_PHASES:
        return None
    return left_of(spec.startup_deadline_seconds, since, now)


def requeue_after(status: JobStatus, spec: JobSpec, now: datetime) -> float | None:
    """Seconds until the next deadline (active, startup) or the TTL falls due, for a timer; None if none."""
    due = (deadline_remaining(status, spec, now), startup_remaining(status, spec, now), ttl_remaining(status, spec, now))
    pending = [r for r in due if r is not None]
    return max(0.0, min(pending)) if pending else None
