"""Pure reconciliation logic: pods -> summary -> decision -> status patch.

A reconcile pass (the handler's job) is:
    summary  = summarize_pods(pods, attempt=status.get("attempt", 0))
    decision = decide(spec, status, summary, now)
    delete decision.delete_pods; create build_pod(job, spec, r, decision.attempt) for r in decision.create_ranks
    patch status with compute_status(spec, status, summary, decision, now, generation)

Pods of older attempts and pods being deleted still hold their names ('<job>-<rank>'), so ranks are
only created once their name is free; a gang restart therefore takes two passes (delete, then create).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable, Mapping

from ddp_operator import constants as c
from ddp_operator.manifests import pod_name
from ddp_operator.spec import InvalidSpec, JobSpec

TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


# --- time ------------------------------------------------------------------------


def format_time(moment: datetime) -> str:
    """RFC 3339 in UTC with second precision, as Kubernetes writes times."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc).strftime(TIME_FORMAT)


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


# --- pods -> summary ---------------------------------------------------------------


@dataclass(frozen=True)
class RankFailure:
    rank: int
    pod: str
    exit_code: int | None
    reason: str
    evicted: bool  # the node or the scheduler took the pod away, not the training code
    finished_at: str | None = None

    def describe(self) -> str:
        if self.exit_code is not None:
            return f"rank {self.rank} (pod {self.pod}) exited with code {self.exit_code} ({self.reason})"
        if self.evicted:
            return f"rank {self.rank} (pod {self.pod}) was lost: {self.reason}"
        return f"rank {self.rank} (pod {self.pod}) failed: {self.reason}"

    def as_status(self) -> dict[str, Any]:
        """The status.failedRank object."""
        return {"rank": self.rank, "pod": self.pod, "exitCode": self.exit_code, "reason": self.reason}


@dataclass(frozen=True)
class PodSummary:
    """The pods of one job, seen from its current gang attempt.

    Counts cover only current-attempt pods that are not being deleted. `occupied_ranks` holds the
    rank of every pod that exists (any attempt, deleting or not): its name '<job>-<rank>' is taken,
    so that rank is created only once the pod is gone.
    """

    attempt: int
    job_name: str = ""
    pending: int = 0
    running: int = 0
    ready: int = 0
    succeeded: int = 0
    failed: int = 0
    live_ranks: frozenset[int] = frozenset()  # current attempt, not being deleted
    active_pods: tuple[str, ...] = ()  # current attempt, trainer not finished, not being deleted
    finished_pods: tuple[str, ...] = ()  # current attempt, trainer finished, not being deleted
    stale_pods: tuple[str, ...] = ()  # other attempts (or unlabelled), not yet being deleted
    occupied_ranks: frozenset[int] = frozenset()
    failure: RankFailure | None = None  # the earliest failed rank of the current attempt
    problems: tuple[str, ...] = ()  # e.g. "rank 1: ImagePullBackOff", for status.message
    uids: Mapping[str, str] = field(default_factory=dict)  # pod name -> uid, for deletes that miss a newer pod

    @property
    def total(self) -> int:
        return len(self.live_ranks)


def summarize_pods(pods: Iterable[Mapping[str, Any]], attempt: int, job_name: str = "") -> PodSummary:
    """Counts and the earliest failure for `attempt`; job_name (else the pods' label) names lost ranks' pods."""
    counts = {"pending": 0, "running": 0, "ready": 0, "succeeded": 0, "failed": 0}
    live: set[int] = set()
    active: list[str] = []
    finished: list[str] = []
    stale: list[str] = []
    occupied: set[int] = set()
    failures: list[RankFailure] = []
    problems: list[str] = []
    uids: dict[str, str] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        name = meta.get("name", "")
        uids[name] = meta.get("uid", "")
        job_name = job_name or (meta.get("labels") or {}).get(c.LABEL_JOB_NAME, "")
        rank = _label_int(meta, c.LABEL_RANK)
        if rank is not None:
            occupied.add(rank)
        if meta.get("deletionTimestamp"):
            continue
        if rank is None or _label_int(meta, c.LABEL_ATTEMPT) != attempt:
            stale.append(name)
            continue
        live.add(rank)
        state = pod_state(pod)
        counts[state] += 1
        (active if state in ("pending", "running") else finished).append(name)
        if state == "running" and is_ready(pod):
            counts["ready"] += 1
        if state == "failed":
            failures.append(rank_failure(pod, rank))
        problem = waiting_problem(pod)
        if problem:
            problems.append(f"rank {rank}: {problem}")
    failures.sort(key=lambda f: (f.finished_at or "", f.rank))
    return PodSummary(
        attempt=attempt,
        job_name=job_name,
        live_ranks=frozenset(live),
        active_pods=tuple(sorted(active)),
        finished_pods=tuple(sorted(finished)),
        stale_pods=tuple(sorted(stale)),
        occupied_ranks=frozenset(occupied),
        failure=failures[0] if failures else None,
        problems=tuple(sorted(problems)),
        uids=uids,
        **counts,
    )


def pod_state(pod: Mapping[str, Any]) -> str:
    """pending | running | succeeded | failed, judged by the trainer container first.

    The trainer's own exit decides, so a sidecar that keeps a pod Running does not hide a finished rank.
    """
    status = pod.get("status") or {}
    terminated = (trainer_status(pod).get("state") or {}).get("terminated")
    if terminated is not None:
        return "succeeded" if terminated.get("exitCode") == 0 else "failed"
    phase = status.get("phase", "Pending")
    return {"Running": "running", "Succeeded": "succeeded", "Failed": "failed"}.get(phase, "pending")


def trainer_status(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    named = [s for s in statuses if s.get("name") == c.CONTAINER_NAME]
    found: Mapping[str, Any] = (named or statuses or [{}])[0]
    return found


def is_ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(cond.get("type") == "Ready" and cond.get("status") == "True" for cond in conditions)


def is_eviction(pod: Mapping[str, Any]) -> bool:
    """Whether the pod was removed by the node or scheduler (evicted, preempted, node lost, ...)."""
    status = pod.get("status") or {}
    reason = status.get("reason") or ""
    if reason in c.EVICTION_REASONS or reason.startswith(c.EVICTION_REASON_PREFIX):
        return True
    return any(
        cond.get("type") == "DisruptionTarget" and cond.get("status") == "True"
        for cond in status.get("conditions") or []
    )


def rank_failure(pod: Mapping[str, Any], rank: int) -> RankFailure:
    terminated = (trainer_status(pod).get("state") or {}).get("terminated") or {}
    status = pod.get("status") or {}
    evicted = is_eviction(pod)
    exit_code = terminated.get("exitCode")
    if evicted:
        reason = status.get("reason") or _disruption_reason(status) or "Evicted"
    else:
        reason = terminated.get("reason") or status.get("reason") or "Failed"
    return RankFailure(
        rank=rank,
        pod=(pod.get("metadata") or {}).get("name", ""),
        exit_code=exit_code,
        reason=reason,
        evicted=evicted,
        finished_at=terminated.get("finishedAt"),
    )


def waiting_problem(pod: Mapping[str, Any]) -> str | None:
    """A reason a pending rank is stuck (ImagePullBackOff, CreateContainerConfigError, ...)."""
    waiting = (trainer_status(pod).get("state") or {}).get("waiting") or {}
    reason = waiting.get("reason")
    return str(reason) if reason and reason != "ContainerCreating" else None


def _disruption_reason(status: Mapping[str, Any]) -> str | None:
    for cond in status.get("conditions") or []:
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            return str(cond.get("reason") or "") or None
    return None


def _label_int(meta: Mapping[str, Any], key: str) -> int | None:
    value = (meta.get("labels") or {}).get(key)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


# --- policy ---------------------------------------------------------------------------


def is_retryable(policy: str, failure: RankFailure) -> bool:
    """OnFailure: always; Never: never; ExitCode: evictions, lost pods and exit codes 128-255
    (signals: OOM kill, SIGTERM, ...) are retried, 1-127 (the program's own errors) are permanent.
    A failure with no exit code (the container never ran) counts as retryable under ExitCode."""
    if policy == c.POLICY_ON_FAILURE:
        return True
    if policy == c.POLICY_NEVER:
        return False
    if failure.evicted or failure.exit_code is None:
        return True
    return not 1 <= failure.exit_code <= 127


def deadline_exceeded(status: Mapping[str, Any], spec: JobSpec, now: datetime) -> bool:
    """activeDeadlineSeconds counts from status.startTime, which suspension clears (as for batch Jobs)."""
    remaining = deadline_remaining(status, spec, now)
    return remaining is not None and remaining <= 0


def deadline_remaining(status: Mapping[str, Any], spec: JobSpec, now: datetime) -> float | None:
    start = parse_time(status.get("startTime"))
    if spec.active_deadline_seconds is None or start is None or status.get("phase") in c.TERMINAL_PHASES:
        return None
    return (start + timedelta(seconds=spec.active_deadline_seconds) - now).total_seconds()


def ttl_expired(status: Mapping[str, Any], spec: JobSpec, now: datetime) -> bool:
    """Whether a finished job should now be deleted (ttlSecondsAfterFinished after completionTime)."""
    remaining = ttl_remaining(status, spec, now)
    return remaining is not None and remaining <= 0


def ttl_remaining(status: Mapping[str, Any], spec: JobSpec, now: datetime) -> float | None:
    done = parse_time(status.get("completionTime"))
    if spec.ttl_seconds_after_finished is None or done is None or status.get("phase") not in c.TERMINAL_PHASES:
        return None
    return (done + timedelta(seconds=spec.ttl_seconds_after_finished) - now).total_seconds()


def requeue_after(status: Mapping[str, Any], spec: JobSpec, now: datetime) -> float | None:
    """Seconds until the deadline or the TTL falls due (whichever is first), for a timer; None if neither."""
    pending = [r for r in (deadline_remaining(status, spec, now), ttl_remaining(status, spec, now)) if r is not None]
    return max(0.0, min(pending)) if pending else None


# --- decision ---------------------------------------------------------------------------


class Action(str, enum.Enum):
    CREATE = "Create"  # create decision.create_ranks
    WAIT = "Wait"  # nothing to create; maybe pods to delete (old attempts, leftovers of a finished job)
    RESTART = "Restart"  # delete the whole gang; the next passes create attempt + 1
    FAIL = "Fail"
    SUCCEED = "Succeed"
    SUSPEND = "Suspend"


@dataclass(frozen=True)
class Decision:
    action: Action
    attempt: int  # the gang attempt after this decision: label new pods with it, store it in status
    reason: str = ""
    message: str = ""
    create_ranks: tuple[int, ...] = ()
    delete_pods: tuple[str, ...] = ()
    failure: RankFailure | None = None


def decide(spec: JobSpec, status: Mapping[str, Any], summary: PodSummary, now: datetime) -> Decision:
    """What to do next. Success means every rank's trainer exited 0 (not just rank 0): a rank still
    running may be writing results. Any failed rank ends the attempt for the whole gang."""
    attempt = summary.attempt
    phase = status.get("phase")
    if phase in c.TERMINAL_PHASES:
        # Stop whatever still runs (a failed gang's survivors); keep finished pods for their logs.
        return Decision(
            Action.WAIT, attempt, status.get("reason", ""), status.get("message", ""), delete_pods=summary.active_pods
        )
    if deadline_exceeded(status, spec, now):
        message = f"activeDeadlineSeconds={spec.active_deadline_seconds} passed since {status.get('startTime')}"
        return _fail(summary, c.REASON_DEADLINE, message)
    if spec.suspend:
        return Decision(
            Action.SUSPEND, attempt, c.REASON_SUSPENDED, "spec.suspend is true", delete_pods=_whole_gang(summary)
        )
    if summary.succeeded == spec.world_size:
        return Decision(Action.SUCCEED, attempt, c.REASON_SUCCEEDED, f"all {spec.world_size} ranks exited 0")
    failure = summary.failure or _lost_rank(spec, status, summary)
    if failure is not None:
        return _on_failure(spec, status, summary, failure)
    free = tuple(r for r in range(spec.world_size) if r not in summary.occupied_ranks)
    action = Action.CREATE if free else Action.WAIT
    return Decision(action, attempt, delete_pods=summary.stale_pods, create_ranks=free)


def _on_failure(spec: JobSpec, status: Mapping[str, Any], summary: PodSummary, failure: RankFailure) -> Decision:
    restarts = int(status.get("restarts", 0))
    if not is_retryable(spec.restart_policy, failure):
        message = f"{failure.describe()}; restartPolicy {spec.restart_policy} does not retry it"
        return _fail(summary, c.REASON_PERMANENT, message, failure)
    if restarts >= spec.backoff_limit:
        message = f"{failure.describe()}; backoffLimit {spec.backoff_limit} reached after {restarts} restarts"
        return _fail(summary, c.REASON_BACKOFF_LIMIT, message, failure)
    reason = c.REASON_RANK_EVICTED if failure.evicted else c.REASON_RANK_FAILED
    message = f"{failure.describe()}; restarting the gang (restart {restarts + 1} of {spec.backoff_limit})"
    return Decision(
        Action.RESTART, summary.attempt + 1, reason, message, delete_pods=_whole_gang(summary), failure=failure
    )


def _fail(summary: PodSummary, reason: str, message: str, failure: RankFailure | None = None) -> Decision:
    return Decision(Action.FAIL, summary.attempt, reason, message, delete_pods=summary.active_pods, failure=failure)


def _lost_rank(spec: JobSpec, status: Mapping[str, Any], summary: PodSummary) -> RankFailure | None:
    """A rank whose pod vanished after the gang formed cannot rejoin: treat it as a lost pod.

    Before the gang formed (phase not yet Running), a missing rank is simply created again: the
    others are still waiting for it at the rendezvous.
    """
    if status.get("phase") != c.PHASE_RUNNING or int(status.get("attempt", 0)) != summary.attempt:
        return None
    missing = [r for r in range(spec.world_size) if r not in summary.live_ranks]
    if not missing:
        return None
    name = pod_name(summary.job_name, missing[0]) if summary.job_name else ""
    return RankFailure(rank=missing[0], pod=name, exit_code=None, reason=c.REASON_RANK_MISSING, evicted=True)


def _whole_gang(summary: PodSummary) -> tuple[str, ...]:
    """Every pod not already being deleted: the current attempt (finished or not) and older ones."""
    return tuple(sorted(set(summary.active_pods + summary.finished_pods + summary.stale_pods)))


# --- status -----------------------------------------------------------------------------

# The conditions a phase makes True; every other known condition that is present becomes False.
PHASE_CONDITION = {
    c.PHASE_RUNNING: c.COND_RUNNING,
    c.PHASE_RESTARTING: c.COND_RESTARTING,
    c.PHASE_SUSPENDED: c.COND_SUSPENDED,
    c.PHASE_SUCCEEDED: c.COND_SUCCEEDED,
    c.PHASE_FAILED: c.COND_FAILED,
}
DECISION_PHASE = {
    Action.RESTART: c.PHASE_RESTARTING,
    Action.FAIL: c.PHASE_FAILED,
    Action.SUCCEED: c.PHASE_SUCCEEDED,
    Action.SUSPEND: c.PHASE_SUSPENDED,
}


def next_phase(status: Mapping[str, Any], summary: PodSummary, decision: Decision, spec: JobSpec) -> str:
    """Pending: no rank running yet. Starting: some ranks running, not all. Running: every rank ready
    (or already succeeded). Restarting: from a gang restart until the new gang is Running.
    Suspended, Succeeded, Failed follow the decision; Succeeded and Failed are final."""
    previous = status.get("phase")
    if previous in c.TERMINAL_PHASES:
        return str(previous)
    if decision.action in DECISION_PHASE:
        return DECISION_PHASE[decision.action]
    if summary.ready > 0 and summary.ready + summary.succeeded >= spec.world_size:
        return c.PHASE_RUNNING
    if previous == c.PHASE_RESTARTING:
        return c.PHASE_RESTARTING
    return c.PHASE_STARTING if summary.running > 0 else c.PHASE_PENDING


def compute_status(
    spec: JobSpec,
    status: Mapping[str, Any],
    summary: PodSummary,
    decision: Decision,
    now: datetime,
    generation: int | None = None,
) -> dict[str, Any]:
    """The status patch (merge-patch semantics: a None value removes the field).

    Writes only operator-owned fields; progress and kopf's own fields are left alone.
    """
    phase = next_phase(status, summary, decision, spec)
    stamp = format_time(now)
    reason, message = _reason_message(phase, status, summary, decision, spec.world_size)
    patch: dict[str, Any] = {
        "phase": phase,
        "attempt": decision.attempt,
        "restarts": int(status.get("restarts", 0)) + (1 if decision.action == Action.RESTART else 0),
        "readyRanks": summary.ready,
        "totalRanks": spec.world_size,
        "ready": f"{summary.ready}/{spec.world_size}",
        "reason": reason,
        "message": message,
        "startTime": _start_time(status, phase, stamp),
        "completionTime": status.get("completionTime") or (stamp if phase in c.TERMINAL_PHASES else None),
        "conditions": _conditions(status, phase, reason, message, summary, decision, now, generation),
    }
    if generation is not None:
        patch["observedGeneration"] = generation
    if decision.failure is not None and status.get("phase") not in c.TERMINAL_PHASES:
        patch["failedRank"] = decision.failure.as_status()
    return patch


# Fields of status this operator owns; progress is the trainer's.
OWNED_STATUS = frozenset({
    "phase", "attempt", "restarts", "readyRanks", "totalRanks", "ready", "reason", "message", "startTime",
    "completionTime", "conditions", "observedGeneration", "failedRank",
})
# What moves with every rank that becomes ready; a patch that changes nothing else may wait a little.
COUNT_FIELDS = frozenset({"readyRanks", "ready", "message"})


def changed_fields(current: Mapping[str, Any], patch: Mapping[str, Any]) -> frozenset[str]:
    """The operator-owned fields whose value the patch changes."""
    return frozenset(f for f in patch if f in OWNED_STATUS and current.get(f) != patch.get(f))


def only_counts_changed(current: Mapping[str, Any], patch: Mapping[str, Any]) -> bool:
    """Whether the patch changes rank counts and the messages quoting them, and nothing else:
    no phase, attempt or restart, and no condition's status or reason."""
    changed = changed_fields(current, patch)
    if not changed or not changed <= COUNT_FIELDS | {"conditions"}:
        return False
    return _condition_states(current.get("conditions")) == _condition_states(patch.get("conditions"))


def _condition_states(conditions: Iterable[Mapping[str, Any]] | None) -> list[tuple[Any, ...]]:
    return [(cond.get("type"), cond.get("status"), cond.get("reason"), cond.get("lastTransitionTime"),
             cond.get("observedGeneration")) for cond in conditions or []]


def invalid_spec_status(
    error: InvalidSpec, status: Mapping[str, Any], now: datetime, generation: int | None = None
) -> dict[str, Any]:
    """Status patch for a spec parse_spec refused: the job fails, the message names the field."""
    message = str(error)
    stamp = format_time(now)
    conditions = set_condition(
        status.get("conditions") or [], c.COND_FAILED, True, c.REASON_INVALID_SPEC, message, now, generation
    )
    patch: dict[str, Any] = {
        "phase": c.PHASE_FAILED,
        "reason": c.REASON_INVALID_SPEC,
        "message": message,
        "completionTime": status.get("completionTime") or stamp,
        "conditions": conditions,
    }
    if generation is not None:
        patch["observedGeneration"] = generation
    return patch


def set_condition(
    conditions: Iterable[Mapping[str, Any]],
    type_: str,
    status: bool | str,
    reason: str,
    message: str,
    now: datetime,
    generation: int | None = None,
) -> list[dict[str, Any]]:
    """A new list with the condition `type_` set; lastTransitionTime moves only when status flips."""
    value = ("True" if status else "False") if isinstance(status, bool) else status
    result = [dict(cond) for cond in conditions]
    current = next((cond for cond in result if cond.get("type") == type_), None)
    updated: dict[str, Any] = {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": format_time(now),
    }
    if generation is not None:
        updated["observedGeneration"] = generation
    if current is None:
        return [*result, updated]
    if current.get("status") == value and current.get("lastTransitionTime"):
        updated["lastTransitionTime"] = current["lastTransitionTime"]
    current.clear()
    current.update(updated)
    return result


def get_condition(conditions: Iterable[Mapping[str, Any]], type_: str) -> Mapping[str, Any] | None:
    return next((cond for cond in conditions if cond.get("type") == type_), None)


def _conditions(
    status: Mapping[str, Any],
    phase: str,
    reason: str,
    message: str,
    summary: PodSummary,
    decision: Decision,
    now: datetime,
    generation: int | None,
) -> list[dict[str, Any]]:
    conditions = [dict(cond) for cond in status.get("conditions") or []]
    created = decision.action == Action.CREATE or summary.total > 0
    if created and get_condition(conditions, c.COND_CREATED) is None:
        conditions = set_condition(
            conditions, c.COND_CREATED, True, c.REASON_CREATED, "rank pods created", now, generation
        )
    active = PHASE_CONDITION.get(phase)
    for type_ in PHASE_CONDITION.values():
        if type_ == active:
            conditions = set_condition(conditions, type_, True, reason, message, now, generation)
        elif get_condition(conditions, type_) is not None:
            conditions = set_condition(conditions, type_, False, reason, message, now, generation)
    return conditions


def _reason_message(
    phase: str, status: Mapping[str, Any], summary: PodSummary, decision: Decision, world_size: int
) -> tuple[str, str]:
    if status.get("phase") in c.TERMINAL_PHASES:
        return status.get("reason", ""), status.get("message", "")
    if decision.reason:
        return decision.reason, decision.message
    if phase == c.PHASE_RUNNING:
        return c.REASON_ALL_READY, f"{summary.ready} ranks ready, {summary.succeeded} finished"
    if phase == c.PHASE_RESTARTING:
        return status.get("reason", ""), status.get("message", "")
    detail = "; ".join(summary.problems)
    waiting = f"{summary.ready}/{world_size} ranks ready, {summary.total} pods exist"
    return c.REASON_WAITING, f"{waiting}; {detail}" if detail else waiting


def _start_time(status: Mapping[str, Any], phase: str, stamp: str) -> str | None:
    """Set when the job first runs unsuspended; cleared by suspension so the deadline restarts."""
    if phase == c.PHASE_SUSPENDED:
        return None
    return status.get("startTime") or stamp
