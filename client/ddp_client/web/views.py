"""What the dashboard's pages show, as JSON-ready dicts made from what the API server and S3 hold: a
row per job, a job's ranks, Events, attempts and curves. Pure functions; the server (server.py)
reads, these decide."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ddp_contract import api, labels, recoveries
from ddp_contract.jobspec import S3Spec
from ddp_contract.jobstatus import (
    PHASE_FAILED,
    PHASE_PENDING,
    STATUS_ATTEMPT_TIME,
    STATUS_COMPLETION_TIME,
    STATUS_CONDITIONS,
    STATUS_DATA_WORKERS,
    STATUS_LAST_CHECKPOINT,
    STATUS_MEMBERS,
    STATUS_MESSAGE,
    STATUS_PHASE,
    STATUS_PROGRESS,
    STATUS_READY,
    STATUS_REASON,
    STATUS_START_TIME,
    STATUS_WORLD_SIZE,
)
from ddp_contract.resource import JobStatus
from ddp_contract.timestamps import parse_rfc3339

from .. import metriccolumns, summary
from ..downsample import largest_triangles_at
from ..metriccolumns import Columns

# Points a curve is drawn with at most: a long run's curve keeps its shape, the page stays light.
POINTS_PER_CURVE = 2000
# Ranks whose curves are drawn side by side at most (more would be lines no one can tell apart).
RANKS_DRAWN = 16
# The bytes of a log a page is sent at a time (the newest first; older pages on request).
LOG_PAGE_BYTES = 64 * 1024

Json = dict[str, Any]


def job_row(job: Mapping[str, Any]) -> Json:
    """One line of the jobs table: what `kubectl get ddpjobs` shows, and how far the job is."""
    meta, spec, status = job.get("metadata") or {}, job.get("spec") or {}, job.get("status") or {}
    progress = status.get(STATUS_PROGRESS) or {}
    return {
        "namespace": meta.get("namespace", ""), "name": meta.get("name", ""),
        "created": meta.get("creationTimestamp"), "phase": status.get(STATUS_PHASE) or PHASE_PENDING,
        "ready": status.get(STATUS_READY) or f"0/{spec.get('worldSize', '?')}",
        "restarts": JobStatus.of(status).restarts, "world": summary.world_size_text(spec, status),
        "epoch": progress.get("epoch"), "step": progress.get("step"), "loss": progress.get("loss"),
        "percent": progress.get("percent"), "remaining": progress.get("remaining"),
        "samplesPerSecond": progress.get("samplesPerSecond"),
        "reason": status.get(STATUS_REASON) or "", "message": status.get(STATUS_MESSAGE) or "",
    }


def deleted_row(namespace: str, name: str, results: str) -> Json:
    """A job whose DDPJob is gone and whose ranks kept something under `results` in S3."""
    return {"namespace": namespace, "name": name, "created": None, "phase": "Deleted", "ready": "", "restarts": None,
            "world": "", "epoch": None, "step": None, "loss": None, "percent": None, "remaining": None,
            "samplesPerSecond": None, "reason": "", "message": f"kept in {results}", "results": results}


def _waiting_words(pod: Mapping[str, Any]) -> str:
    """Why a pod that is not running is held: its trainer's waiting reason, or the scheduler's words."""
    status = pod.get("status") or {}
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") and waiting["reason"] != "ContainerCreating":
            return f"{waiting['reason']}: {waiting.get('message') or ''}".rstrip(": ")
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return f"{condition.get('reason') or 'Unschedulable'}: {condition.get('message') or ''}".rstrip(": ")
    return ""


def _ended(pod: Mapping[str, Any]) -> Json | None:
    """The trainer container's end (exit code, reason) where it ended, else None."""
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        if container.get("name") != labels.CONTAINER_NAME:
            continue
        for state in (container.get("state") or {}, container.get("lastState") or {}):
            terminated = state.get("terminated")
            if terminated:
                return {"exitCode": terminated.get("exitCode"), "reason": terminated.get("reason") or ""}
    return None


def _failed_here(failed: Mapping[str, Any], pod: str, attempt: int, phase: str | None) -> bool:
    """Whether a rank's row is the pod whose failure status.failedRank records: the pod of that name and of
    that attempt (a replacement of the same name is a later attempt's), or any of that name once the job
    has failed (a pod kept across in-place attempts carries its first attempt's label)."""
    return failed.get("pod") == pod and (phase == PHASE_FAILED or failed.get("attempt") == attempt)


def rank_rows(pods: Iterable[Mapping[str, Any]], status: Mapping[str, Any]) -> list[Json]:
    """The ranks' pods in rank order: pod, rank, attempt, node, state, ready, why held up, how it ended;
    the one whose failure ended the last attempt carries its last words (status.failedRank). A failure
    that restarted the gang is said on that restart's mark, not on the row of the pod that replaced it.
    Where status.members names the gang (an elastic job, spare pods), a member's rank is its place there
    and the others' is None (waiting outside the gang), after the members."""
    read = JobStatus.of(status)
    failed, members = read.failed_rank or {}, read.members
    rows = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        pod_labels = meta.get("labels") or {}
        if labels.LABEL_RANK not in pod_labels:
            continue
        conditions = (pod.get("status") or {}).get("conditions") or []
        index = int(pod_labels[labels.LABEL_RANK])
        row: Json = {
            "pod": meta.get("name", ""), "rank": index if members is None else
            (members.index(index) if index in members else None),
            "attempt": int(pod_labels.get(labels.LABEL_ATTEMPT, 0)), "node": (pod.get("spec") or {}).get("nodeName") or "",
            "state": summary.pod_state(pod),
            "ready": any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions),
            "held": _waiting_words(pod), "ended": _ended(pod), "failure": None,
        }
        if failed and _failed_here(failed, row["pod"], row["attempt"], status.get(STATUS_PHASE)):
            row["failure"] = {"reason": failed.get("reason"), "exitCode": failed.get("exitCode"),
                              "kind": failed.get("kind"), "attempt": failed.get("attempt"),
                              "lastWords": failed.get("message") or ""}
        rows.append(row)
    return sorted(rows, key=lambda r: (r["rank"] is None, r["rank"] or 0, r["pod"], r["attempt"]))


def _event_time(event: Mapping[str, Any]) -> str:
    return str(event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp")
               or (event.get("metadata") or {}).get("creationTimestamp") or "")


def event_rows(events: Iterable[Mapping[str, Any]]) -> list[Json]:
    """The job's Events (its own and its pods'), oldest first."""
    rows = [{"time": _event_time(e), "type": e.get("type") or "", "reason": e.get("reason") or "",
             "message": e.get("message") or "", "count": e.get("count") or 1,
             "object": f"{(e.get('involvedObject') or {}).get('kind', '')}/{(e.get('involvedObject') or {}).get('name', '')}"}
            for e in events]
    return sorted(rows, key=lambda r: r["time"])


def job_page(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], events: Iterable[Mapping[str, Any]],
             data_workers: Sequence[Mapping[str, Any]] = ()) -> Json:
    """Everything of a job's page but its curves and logs."""
    spec, status = job.get("spec") or {}, job.get("status") or {}
    failed = status.get(STATUS_PHASE) == PHASE_FAILED
    return {
        "job": job_row(job),
        "status": {"attempt": JobStatus.of(status).attempt, "attemptTime": status.get(STATUS_ATTEMPT_TIME),
                   "startTime": status.get(STATUS_START_TIME), "completionTime": status.get(STATUS_COMPLETION_TIME),
                   "worldSize": status.get(STATUS_WORLD_SIZE), "members": status.get(STATUS_MEMBERS),
                   "progress": status.get(STATUS_PROGRESS) or {}, "lastCheckpoint": status.get(STATUS_LAST_CHECKPOINT),
                   "kept": summary.kept_text(status), "conditions": status.get(STATUS_CONDITIONS) or [],
                   "checkpointsBehind": summary.behind_text(status),
                   "recovery": summary.recovery_text(status), "snapshots": summary.snapshots_text(status),
                   "dataWorkers": status.get(STATUS_DATA_WORKERS)},
        # A finished job's last restart cause is history, not its failure (the same words as `kubectl ddp status`).
        "failure": summary.failure_text(status) if failed else "",
        "lastRestart": "" if failed else summary.last_restart_text(status),
        "ranks": rank_rows(pods, status),
        "dataWorkers": [{"pod": (p.get("metadata") or {}).get("name", ""), "state": summary.pod_state(p),
                         "node": (p.get("spec") or {}).get("nodeName") or "", "held": _waiting_words(p)}
                        for p in data_workers],
        "events": event_rows(events),
        "results": S3Spec.from_spec(spec.get("s3")).results,
    }


def attempt_marks(records: Sequence[Mapping[str, Any]], events: Sequence[Json],
                  kept: Mapping[int, Mapping[str, Any]] | None = None,
                  resumed: Mapping[int, Mapping[str, Any]] | None = None) -> list[Json]:
    """Where each attempt after the first took over, on both axes: its first record's step and time, with
    the job's own Events between the previous attempt's last record and it (why the gang restarted or
    resized), else the cause its rank 0 kept in S3 (`kept`: attempt -> status.attemptCause; Events expire
    and go with the job), and where it resumed from (`resumed`: attempt -> status.recovery, as its rank 0
    kept it). Records without an attempt (written before records carried one) mark nothing."""
    columns = Columns.of(records)
    spans = {attempt: (columns[first]["time"], last, columns[first]["step"])  # first time, last time, first step
             for attempt, (first, last) in metriccolumns.attempt_spans(columns).items()}
    marks = []
    ordered = sorted(spans)
    for before, attempt in zip(ordered, ordered[1:], strict=False):
        since, until = spans[before][1], spans[attempt][0]
        causes = [e for e in events if e["object"].startswith(f"{api.KIND}/")
                  and since - 1 <= _epoch(e["time"]) <= until + 1]
        said = [(e["reason"], e["message"]) for e in causes]
        cause = (kept or {}).get(attempt)
        if not said and cause:
            said = [(cause.get("reason") or "", cause.get("message") or "")]
        recovery = (resumed or {}).get(attempt)
        marks.append({"attempt": attempt, "time": until, "step": spans[attempt][2],
                      "why": "; ".join(f"{reason}: {message}" for reason, message in said),
                      "resumed": recoveries.text(recovery) if recovery else ""})
    return marks


def _epoch(rfc3339: str) -> float:
    parsed = parse_rfc3339(rfc3339)
    return parsed.timestamp() if parsed is not None else float("nan")


def curves(records: Sequence[Mapping[str, Any]], rank: int | None, axis: str = "step",
           points: int = POINTS_PER_CURVE) -> Json:
    """Each metric of `rank` (None: every rank's mean per step) as {"x": [...], "y": [...]}, at most
    `points` points, against the step or (axis "time") the time it was logged. `records` may be a
    Columns of them (its fields read once for all that is drawn of them)."""
    columns = Columns.of(records)
    series = metriccolumns.series(columns, rank)
    timed_steps, when = metriccolumns.step_times(columns, rank) if axis == "time" else (None, None)
    out = {}
    for name, (steps, values) in series.items():
        if timed_steps is None or when is None:
            x, y = steps.astype(np.float64), values
        else:  # the steps logged with a time, at that time
            at, found = metriccolumns.find(timed_steps, steps)
            x, y = when[at[found]], values[found]
        drawn = largest_triangles_at(x, y, points)
        out[name] = {"x": x[drawn].tolist(), "y": y[drawn].tolist(), "points": len(steps)}
    return out


def curves_by_rank(records: Sequence[Mapping[str, Any]], most_ranks: int = RANKS_DRAWN,
                   points: int = POINTS_PER_CURVE) -> Json:
    """Each metric of every rank side by side (the first `most_ranks` ranks that logged), against the step:
    {"x": steps, "ys": {rank: values, None where that rank logged no such step}}. Past `points` steps,
    every n-th of them (ranks drawn together share their steps)."""
    columns = Columns.of(records)
    by_rank = {rank: metriccolumns.series(columns, rank) for rank in np.unique(columns.rank)[:most_ranks].tolist()}
    out: Json = {}
    for name in sorted({name for series in by_rank.values() for name in series}):
        logged = {rank: series[name] for rank, series in by_rank.items() if name in series}
        steps = np.unique(np.concatenate([logged_steps for logged_steps, _ in logged.values()]))
        if len(steps) > points:
            steps = np.r_[steps[(np.arange(points - 1) * (len(steps) / points)).astype(np.intp)], steps[-1]]
        out[name] = {"x": steps.tolist(), "ys": {str(rank): _at_steps(logged.get(rank), steps) for rank in by_rank},
                     "points": max(len(logged_steps) for logged_steps, _ in logged.values())}
    return out


def _at_steps(curve: metriccolumns.Curve | None, steps: npt.NDArray[np.int64]) -> list[float | None]:
    """The curve's values at `steps`, None where it has no such step."""
    if curve is None:
        return [None] * len(steps)
    logged_steps, values = curve
    at, found = metriccolumns.find(logged_steps, steps)
    return [value if ok else None for value, ok in zip(values[at].tolist(), found.tolist(), strict=True)]


def last_steps(records: Iterable[Mapping[str, Any]]) -> dict[int, Json]:
    """Each rank's newest record: its step and when (a rank far behind the others is slow or stuck)."""
    columns = Columns.of(records if isinstance(records, Sequence) else list(records))
    return {rank: {"step": int(columns[newest]["step"]), "time": float(columns[newest]["time"])}
            for rank, newest in metriccolumns.newest(columns).items()}


def log_page(text: str, end: int | None = None, size: int = LOG_PAGE_BYTES) -> Json:
    """The part of a rank's log (as bytes of UTF-8) that ends at `end` (None: its end), at most `size`
    bytes, cut at a line's start; `start` is where the next older page ends."""
    data = text.encode()
    stop = len(data) if end is None else max(0, min(end, len(data)))
    start = max(0, stop - size)
    if start > 0:
        newline = data.find(b"\n", start, stop)
        start = newline + 1 if newline >= 0 else start
    return {"text": data[start:stop].decode(errors="replace"), "start": start, "end": stop, "total": len(data)}
