"""When a status pass looks at a job again, for what no watch reports: the nearest of the waits what
the pass found starts (`look_again`), which the status queue (WorkQueue) runs the job's next pass
after. Everything else that changes (the job, its pods, their nodes, its Workload) wakes it at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ddp_contract.jobspec import JobSpec
from ddp_contract.resource import JobStatus
from ddp_operator.admission import Refused
from ddp_operator.deadlines import requeue_after
from ddp_operator.nodes import Nodes, seconds_until_lost
from ddp_operator.statuspatch import only_counts_changed

# A job's status is patched for rank counts alone (readyRanks 3/8 -> 4/8) at most once a second at
# first, then the less often the longer the counts keep moving without a phase change: a quarter of
# that time, at most 30 s. A gang of 8 coming up writes a few times, one of 10,000 pods coming up over
# minutes some twenty times, not hundreds; a phase change never queues behind them.
COUNTS_INTERVAL = 1.0
COUNTS_INTERVAL_MAX = 30.0
COUNTS_SLOWDOWN = 4.0
# Seconds between looks at objects holding a job's names, which no watch of ours reports.
IN_THE_WAY_RECHECK = 5.0
# Seconds between tries to create data workers the API server (or a quota) refused.
DATA_WORKERS_REFUSED_RECHECK = 10.0
# Seconds between passes for a queued job while the Workload watch has not listed them yet.
WORKLOADS_UNSYNCED_RECHECK = 1.0


def counts_interval(counting_for: float) -> float:
    """The seconds between count-only patches, the counts having moved for `counting_for` seconds since
    the job's status last changed more than its counts."""
    return min(COUNTS_INTERVAL_MAX, max(COUNTS_INTERVAL, counting_for / COUNTS_SLOWDOWN))


def counts_wait(status: Mapping[str, Any], patch: Mapping[str, Any], since_patched: float,
                counting_for: float = 0.0) -> float | None:
    """Seconds to hold back `patch` where it only moves rank counts, the job's status having last been
    patched `since_patched` seconds ago and last changed more than its counts `counting_for` seconds ago;
    None to patch now."""
    if not only_counts_changed(status, patch):
        return None
    interval = counts_interval(counting_for)
    return interval - since_patched if since_patched < interval else None


def quota_wait(refused: Refused | None, attempt: int, clock: float) -> float | None:
    """Seconds until the next try to create the gang of `attempt` that a quota refused (`refused`, what
    the last creation pass could not create; `clock`, the monotonic time now); None to try now."""
    if refused is None or not refused.refusal.waits or refused.attempt != attempt:
        return None
    left = refused.retry_at - clock
    return left if left > 0 else None


@dataclass(frozen=True)
class Found:
    """What a status pass found that a later pass depends on; None (or False) where it found nothing."""

    spec: JobSpec
    status: JobStatus  # as the pass leaves it: the recorded status with the pass's patch
    now: datetime
    nodes: Nodes  # the node watch's view
    bound: frozenset[str] = frozenset()  # the nodes the job's pods are bound to
    decided: float | None = None  # the decision's own (Decision.recheck_after)
    counts_held: float | None = None  # a patch of rank counts alone held back (counts_wait)
    quota_held: float | None = None  # a gang to create that a quota refused (quota_wait)
    in_the_way: bool = False  # objects not the job's hold its names
    data_workers_refused: bool = False  # data workers the job keeps, refused last time
    workload_retry: float | None = None  # a Workload the API refused (KueueGate.recheck_after)
    scheduler_due: float | None = None  # a pod's scheduler not answering, to be said (PodSummary.scheduler_due)


def look_again(found: Found) -> float | None:
    """Seconds until the job's next status pass: the nearest of the waits `found` starts, with a NotReady
    node under a pod counting as lost and the deadlines (activeDeadlineSeconds, startupDeadlineSeconds,
    ttlSecondsAfterFinished) falling due; None: none, the watches wake the job."""
    due = (
        found.counts_held,
        IN_THE_WAY_RECHECK if found.in_the_way else None,
        DATA_WORKERS_REFUSED_RECHECK if found.data_workers_refused else None,
        found.workload_retry,
        found.scheduler_due,
        seconds_until_lost(found.bound, found.nodes, found.spec.node_lost_grace_seconds, found.now),
        found.quota_held,
        found.decided,
        requeue_after(found.status, found.spec, found.now),
    )
    return min((t for t in due if t is not None), default=None)
