"""The operator's Prometheus metrics: every definition lives here.

Counters and histograms are updated where the operator acts, and nowhere else: the work queue
(reconcile latency, errors, depth), kubeapi (every API request, pods created and deleted) and the
reconciler (a status it recorded: gang restarts, time to first Running). What describes the jobs
themselves (how many are in each phase, rank 0's throughput) is read from the job store when
Prometheus scrapes (`JobCollector`), so a deleted job's series go with it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from ddp_contract.jobstatus import (
    STATUS_CONDITIONS,
    STATUS_FAILED_RANK,
    STATUS_PHASE,
    STATUS_PROGRESS,
    STATUS_REASON,
    STATUS_RESTARTS,
)
from ddp_contract.timestamps import parse_rfc3339
from ddp_operator import constants as c

NAMESPACE = "ddp_operator"

PODS_CREATED = Counter("pods_created", "Rank pods the operator created.", namespace=NAMESPACE)
PODS_DELETED = Counter("pods_deleted", "Rank pods the operator deleted (forced: grace period 0, a lost node's).",
                       ["forced"], namespace=NAMESPACE)
# Both children at 0 from the start, as the work queues' error counters are: a counter whose series
# appears at 1 hides that first increment from rate() and increase(), so a dashboard would miss it.
PODS_DELETED.labels("false")
PODS_DELETED.labels("true")
GANG_RESTARTS = Counter("gang_restarts", "Gang restarts, by the restart's reason and the failure's kind.",
                        ["reason", "kind"], namespace=NAMESPACE)
TIME_TO_RUNNING = Histogram(
    "time_to_running_seconds", "Seconds from a job's creation to its first Running phase (every rank ready).",
    namespace=NAMESPACE, buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600))
RECONCILE_SECONDS = Histogram("reconcile_seconds", "Seconds one pass of a work queue took, by queue.",
                              ["queue"], namespace=NAMESPACE)
RECONCILE_ERRORS = Counter("reconcile_errors", "Passes that raised (retried with backoff), by queue.",
                           ["queue"], namespace=NAMESPACE)
QUEUE_DEPTH = Gauge("workqueue_depth", "Keys waiting in a work queue (not counting the ones being worked on).",
                    ["queue"], namespace=NAMESPACE)
API_REQUESTS = Counter("api_requests", "Requests to the Kubernetes API, by verb, resource and HTTP status code "
                       "(0: no answer).", ["verb", "resource", "code"], namespace=NAMESPACE)
LEADER = Gauge("leader", "1 while this process acts on jobs (holds the lease, or runs without election), else 0.",
               namespace=NAMESPACE)

JOBS = "jobs"
SAMPLES_PER_SECOND = "job_samples_per_second"
STEP_SECONDS = "job_step_seconds"
# status.progress fields exported per Running job, by metric name.
PROGRESS_GAUGES = {
    SAMPLES_PER_SECOND: ("samplesPerSecond", "Rank 0's training throughput (status.progress.samplesPerSecond)."),
    STEP_SECONDS: ("stepSeconds", "Rank 0's mean seconds per training step (status.progress.stepSeconds)."),
}

# --- what the HTTP requests were -------------------------------------------------------------------------------
METHOD_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch"}


def request_labels(method: str, path: str, query: Sequence[tuple[str, Any]] | None) -> tuple[str, str]:
    """(verb, resource) of an API request in Kubernetes' terms: `GET /api/v1/namespaces/a/pods?watch=true`
    is (watch, pods); a subresource is named after its resource (`ddpjobs/status`)."""
    parts = [p for p in path.split("/") if p]
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:]  # past /api/v1 or /apis/<group>/<version>
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        rest = rest[2:]  # a namespaced resource
    resource = rest[0] if rest else "discovery"
    if len(rest) > 2:
        resource = f"{resource}/{rest[2]}"
    named = len(rest) > 1
    method = method.upper()
    if method == "GET":
        watching = any(k == "watch" and str(v).lower() in ("true", "1") for k, v in query or ())
        return ("watch" if watching else "get" if named else "list"), resource
    if method == "DELETE":
        return ("delete" if named else "deletecollection"), resource
    return METHOD_VERBS.get(method, method.lower()), resource


def api_request(method: str, path: str, query: Sequence[tuple[str, Any]] | None, code: int) -> None:
    API_REQUESTS.labels(*request_labels(method, path, query), str(code)).inc()


# --- what a recorded status says happened ------------------------------------------------------------------------
def restart_recorded(status: Mapping[str, Any], patch: Mapping[str, Any]) -> tuple[str, str] | None:
    """(reason, kind) when the patch records a new gang restart, else None."""
    if int(patch.get(STATUS_RESTARTS, 0) or 0) <= int(status.get(STATUS_RESTARTS, 0) or 0):
        return None
    failed = patch.get(STATUS_FAILED_RANK) or {}
    return str(patch.get(STATUS_REASON) or ""), str(failed.get("kind") or "")


def first_running_after(job: Mapping[str, Any], status: Mapping[str, Any], patch: Mapping[str, Any],
                        now: datetime) -> float | None:
    """Seconds since the job's creation when the patch makes it Running for the first time: it has
    never had the Running condition (which stays, False, after a restart)."""
    if patch.get(STATUS_PHASE) != c.PHASE_RUNNING or status.get(STATUS_PHASE) == c.PHASE_RUNNING:
        return None
    if any(cond.get("type") == c.COND_RUNNING for cond in status.get(STATUS_CONDITIONS) or []):
        return None
    created = parse_rfc3339(job.get("metadata", {}).get("creationTimestamp"))
    return max(0.0, (now - created).total_seconds()) if created else None


def status_recorded(job: Mapping[str, Any], status: Mapping[str, Any], patch: Mapping[str, Any], now: datetime) -> None:
    """Counts what a status patch the API accepted records: a gang restart, a first Running."""
    restart = restart_recorded(status, patch)
    if restart is not None:
        GANG_RESTARTS.labels(*restart).inc()
    seconds = first_running_after(job, status, patch, now)
    if seconds is not None:
        TIME_TO_RUNNING.observe(seconds)


# --- what the jobs are now, read at scrape time --------------------------------------------------------------------
def job_families(jobs: Iterable[Mapping[str, Any]]) -> list[Metric]:
    """Jobs by phase (every phase, 0 included; a job not yet given one is Pending), and rank 0's
    progress for each Running job that reported it."""
    by_phase = GaugeMetricFamily(f"{NAMESPACE}_{JOBS}", "DDPJobs by phase.", labels=["phase"])
    progress = {name: GaugeMetricFamily(f"{NAMESPACE}_{name}", help_, labels=["namespace", "name"])
                for name, (_, help_) in PROGRESS_GAUGES.items()}
    counts = dict.fromkeys(c.PHASES, 0)
    for job in jobs:
        status = job.get("status") or {}
        phase = status.get(STATUS_PHASE) or c.PHASE_PENDING
        counts[phase] = counts.get(phase, 0) + 1
        if phase != c.PHASE_RUNNING:
            continue
        meta = job.get("metadata", {})
        for name, (field, _) in PROGRESS_GAUGES.items():
            value = (status.get(STATUS_PROGRESS) or {}).get(field)
            if isinstance(value, int | float) and not isinstance(value, bool):
                progress[name].add_metric([meta.get("namespace", ""), meta.get("name", "")], float(value))
    for phase, count in counts.items():
        by_phase.add_metric([phase], count)
    return [by_phase, *progress.values()]


class JobCollector(Collector):
    """Reads the jobs the operator knows at each scrape."""

    def __init__(self, jobs: Callable[[], Iterable[Mapping[str, Any]]]) -> None:
        self._jobs = jobs

    def collect(self) -> Iterator[Metric]:
        yield from job_families(self._jobs())
