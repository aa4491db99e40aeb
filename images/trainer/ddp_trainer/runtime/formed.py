"""Rank 0's word that its attempt's gang formed: status.rendezvous, and why the attempt began
(status.attemptCause, read from the answer to that write) kept in S3 beside the attempt's logs and metrics,
where the dashboard's restart marks find it once the job's Events have expired or the job is deleted."""

from __future__ import annotations

import threading

from ddp_contract.jobstatus import STATUS_RENDEZVOUS
from ddp_contract.resource import JobStatus

from .. import jobstatus
from ..storage.results import keep_attempt_cause


def record_formed(attempt: int, formed_s: float, check_s: float | None,
                  sink: jobstatus.JobStatusSink | None = None) -> threading.Thread | None:
    """Writes status.rendezvous; for an attempt after the first, keeps its cause in S3 on a thread of its own
    (returned), so that a slow S3 never holds training up. Never raises: both are courtesies."""
    job = jobstatus.recorded({STATUS_RENDEZVOUS: jobstatus.rendezvous(attempt, formed_s, check_s)}, sink)
    cause = JobStatus.of((job or {}).get("status") or {}).attempt_cause(attempt) if attempt > 0 else None
    if cause is None:
        return None
    keeping = threading.Thread(target=keep_attempt_cause, args=(attempt, dict(cause)), name="attempt-cause",
                               daemon=True)
    keeping.start()
    return keeping
