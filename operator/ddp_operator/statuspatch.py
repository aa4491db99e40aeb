"""The status a job's decision leads to, as a merge patch: phase, counts, conditions, failure record.

Writes only the fields the operator owns; status.progress is rank 0's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from ddp_contract import api
from ddp_contract.resource import (
    STATUS_ATTEMPT,
    STATUS_ATTEMPT_CAUSE,
    STATUS_ATTEMPT_TIME,
    STATUS_FAILED_RANK,
    STATUS_PHASE,
    STATUS_RECREATED_ATTEMPT,
    STATUS_RESTARTS,
    JobStatus,
)
from ddp_contract.timestamps import rfc3339
from ddp_operator import constants as c
from ddp_operator.conditions import get_condition, set_condition
from ddp_operator.dataworkers import data_worker_events
from ddp_operator.decision import Action, Decision
from ddp_operator.podsummary import PodSummary
from ddp_operator.policy import RESTART_COUNTERS
from ddp_operator.spec import InvalidSpec, JobSpec

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
    Action.RECREATE: c.PHASE_RESTARTING,
    Action.RESIZE: c.PHASE_RESTARTING,
    Action.FAIL: c.PHASE_FAILED,
    Action.SUCCEED: c.PHASE_SUCCEEDED,
    Action.SUSPEND: c.PHASE_SUSPENDED,
    Action.QUEUE: c.PHASE_PENDING,
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
    # In place, a restarted gang's pods stay ready throughout: it runs again once rank 0 says it formed.
    regrouping = spec.in_place and previous == c.PHASE_RESTARTING and not JobStatus.of(status).gang_formed
    if summary.ready > 0 and summary.ready + summary.succeeded >= summary.gang_pods(spec.pods) and not regrouping:
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
    stamp = rfc3339(now)
    reason, message = _reason_message(phase, status, summary, decision, spec)
    per_pod, gang = spec.ranks_per_pod, summary.gang_pods(spec.pods)
    members = decision.members or summary.gang or tuple(range(spec.pods))
    patch: dict[str, Any] = {
        STATUS_PHASE: phase,
        STATUS_ATTEMPT: decision.attempt,
        STATUS_RECREATED_ATTEMPT: recreated_attempt(status, decision, spec),
        STATUS_ATTEMPT_TIME: attempt_time(status, decision, stamp),
        STATUS_RESTARTS: JobStatus.of(status).restarts + (1 if decision.action == Action.RESTART else 0),
        **_kind_restarts(status, decision),
        "readyRanks": summary.ready * per_pod,
        "totalRanks": gang * per_pod,
        "readyPods": summary.ready,
        "totalPods": gang,
        "ready": f"{summary.ready * per_pod}/{gang * per_pod}",
        api.STATUS_WORLD_SIZE: len(members) * per_pod,
        "reason": reason,
        "message": message,
        "startTime": _start_time(status, phase, stamp, decision),
        "completionTime": status.get("completionTime") or (stamp if phase in c.TERMINAL_PHASES else None),
        "conditions": _conditions(status, phase, reason, message, summary, decision, now, generation),
    }
    if spec.elastic:
        patch[api.STATUS_MEMBERS] = list(members)
        asked = decision.checkpoint_wanted
        patch[api.STATUS_CHECKPOINT_REQUESTED] = asked.as_status() if asked is not None else None
    if decision.action == Action.RESIZE:
        patch["conditions"] = _shrunk(patch["conditions"], decision, len(members) < spec.pods, now, generation)
    if decision.action in (Action.RESTART, Action.RESIZE):
        patch[api.STATUS_PROCESS_FAILURES] = None  # the attempt they were reported for is over
    if generation is not None:
        patch["observedGeneration"] = generation
    if decision.failure is not None and status.get("phase") not in c.TERMINAL_PHASES:
        patch[STATUS_FAILED_RANK] = decision.failure.as_status()
    if decision.attempt != JobStatus.of(status).attempt:
        # In words the Event says too: rank 0 keeps them in S3 with the attempt, for when both are gone.
        patch[STATUS_ATTEMPT_CAUSE] = {STATUS_ATTEMPT: decision.attempt, "reason": reason, "message": message,
                                       "time": stamp}
    return patch


def recreated_attempt(status: Mapping[str, Any], decision: Decision, spec: JobSpec) -> int:
    """status.recreatedAttempt: the attempt whose pods were last all created anew. A Recreate restart
    moves it to the new attempt; an InPlace one keeps the pods that go on, and so the value."""
    if (decision.action == Action.RESTART and not spec.in_place) or decision.action == Action.RECREATE:
        return decision.attempt
    return pod_attempt_floor(status)


def attempt_time(status: Mapping[str, Any], decision: Decision, stamp: str) -> str:
    """status.attemptTime: when the current attempt began (the job's first pods, a gang restart, a
    resize); a restart that follows another while the job is Restarting moves it, where the Restarting
    condition's lastTransitionTime stays."""
    kept = status.get(STATUS_ATTEMPT_TIME)
    if kept and decision.attempt == JobStatus.of(status).attempt:
        return str(kept)
    return stamp


def pod_attempt_floor(status: Mapping[str, Any]) -> int:
    """The oldest attempt whose pods still belong to the gang (status.recreatedAttempt, else attempt)."""
    read = JobStatus.of(status)
    recreated = read.recreated_attempt
    return read.attempt if recreated is None else min(recreated, read.attempt)


def _kind_restarts(status: Mapping[str, Any], decision: Decision) -> dict[str, int]:
    """programRestarts and infrastructureRestarts, the one the restart's failure draws on counted up."""
    counts = {field: int(status.get(field, 0)) for field in RESTART_COUNTERS.values()}
    if decision.action == Action.RESTART and decision.failure is not None:
        counts[RESTART_COUNTERS[decision.failure.kind]] += 1
    return counts


# Fields of status this operator owns; progress is the trainer's.
OWNED_STATUS = frozenset({
    *RESTART_COUNTERS.values(), STATUS_PHASE, STATUS_ATTEMPT, STATUS_ATTEMPT_TIME, STATUS_RECREATED_ATTEMPT,
    api.STATUS_PROCESS_FAILURES, STATUS_RESTARTS,
    "readyRanks", "totalRanks", "readyPods", "totalPods",
    "ready", "reason", api.STATUS_WORLD_SIZE, api.STATUS_MEMBERS, api.STATUS_CHECKPOINT_REQUESTED,
    "message", "startTime", "completionTime", "conditions", "observedGeneration", STATUS_FAILED_RANK, "dataWorkers",
})
# What moves with every rank that becomes ready; a patch that changes nothing else may wait a little.
COUNT_FIELDS = frozenset({"readyRanks", "readyPods", "ready", "message"})


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
    stamp = rfc3339(now)
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


def failed_pass_status(status: Mapping[str, Any], message: str) -> dict[str, Any] | None:
    """Status patch for a status pass that raised (passerrors.py): reason ReconcileError and why, the phase
    kept (Pending for a job that has none yet); the next pass that succeeds writes its own. None where
    the status says so already, or the job has ended: its reason stays why it ended."""
    if status.get("phase") in c.TERMINAL_PHASES or (
            status.get("reason") == c.REASON_RECONCILE_ERROR and status.get("message") == message):
        return None
    return {"phase": status.get("phase") or c.PHASE_PENDING, "reason": c.REASON_RECONCILE_ERROR, "message": message}


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
    cause, detail = summary.held_up if phase not in c.TERMINAL_PHASES else ("", "")
    if cause:
        conditions = set_condition(conditions, c.COND_RANKS_BLOCKED, True, cause, detail, now, generation)
    elif get_condition(conditions, c.COND_RANKS_BLOCKED) is not None:
        conditions = set_condition(conditions, c.COND_RANKS_BLOCKED, False, c.REASON_NOT_BLOCKED, "", now, generation)
    active = PHASE_CONDITION.get(phase)
    for type_ in PHASE_CONDITION.values():
        if type_ == active:
            if phase == c.PHASE_RESTARTING and decision.action not in (Action.RESTART, Action.RESIZE):
                continue  # it keeps why the gang restarted; status.reason may say what holds the new gang up
            conditions = set_condition(conditions, type_, True, reason, message, now, generation)
        elif get_condition(conditions, type_) is not None:
            conditions = set_condition(conditions, type_, False, reason, message, now, generation)
    return conditions


def _shrunk(conditions: list[dict[str, Any]], decision: Decision, short: bool, now: datetime,
            generation: int | None) -> list[dict[str, Any]]:
    """The Shrunk condition after a resize: True with why while the gang is short of spec.worldSize."""
    if short:
        return set_condition(conditions, c.COND_SHRUNK, True, decision.reason, decision.message, now, generation)
    return set_condition(conditions, c.COND_SHRUNK, False, c.REASON_FULL_SIZE, decision.message, now, generation)


def _reason_message(
    phase: str, status: Mapping[str, Any], summary: PodSummary, decision: Decision, spec: JobSpec
) -> tuple[str, str]:
    if status.get("phase") in c.TERMINAL_PHASES:
        return status.get("reason", ""), status.get("message", "")
    if decision.reason:
        return decision.reason, decision.message
    if phase == c.PHASE_RUNNING:
        per_pod = spec.ranks_per_pod
        return c.REASON_ALL_READY, f"{summary.ready * per_pod} ranks ready, {summary.succeeded * per_pod} finished"
    gang = summary.gang_pods(spec.pods) * spec.ranks_per_pod
    waiting = f"{summary.ready * spec.ranks_per_pod}/{gang} ranks ready, {summary.total} pods exist"
    cause, detail = summary.held_up
    if cause:
        return cause, f"{waiting}; {detail}"
    if phase == c.PHASE_RESTARTING:  # why the gang restarted, as its condition keeps it
        restarted = get_condition(status.get("conditions") or [], c.COND_RESTARTING) or status
        return restarted.get("reason", ""), restarted.get("message", "")
    return c.REASON_WAITING, waiting


def _start_time(status: Mapping[str, Any], phase: str, stamp: str, decision: Decision) -> str | None:
    """Set when the job first runs unsuspended (and admitted, in a Kueue queue); cleared by
    suspension and by waiting in the queue, so the deadline restarts."""
    if phase == c.PHASE_SUSPENDED or decision.action == Action.QUEUE:
        return None
    return status.get("startTime") or stamp


WARNING_PHASES = frozenset({c.PHASE_FAILED, c.PHASE_RESTARTING})
RESIZE_EVENTS = {c.REASON_SHRUNK: "Warning", c.REASON_GROWN: "Normal"}


def events_for(status: Mapping[str, Any], patch: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """The Events a status change deserves, as (type, reason, message): a new phase, and ranks newly
    held up (or held up for another cause, or other ranks)."""
    events: list[tuple[str, str, str]] = []
    phase = patch.get("phase")
    if phase and phase != status.get("phase"):
        kind = RESIZE_EVENTS.get(patch.get("reason") or "") or ("Warning" if phase in WARNING_PHASES else "Normal")
        events.append((kind, patch.get("reason") or phase, patch.get("message") or f"phase {phase}"))
    elif patch.get("reason") == c.REASON_IN_PLACE_TIMED_OUT != status.get("reason"):
        events.append(("Warning", c.REASON_IN_PLACE_TIMED_OUT, str(patch.get("message"))))
    elif patch.get("reason") in RESIZE_EVENTS and patch.get("attempt") != status.get("attempt"):
        events.append((RESIZE_EVENTS[patch["reason"]], patch["reason"], str(patch.get("message"))))
    before = get_condition(status.get("conditions") or [], c.COND_RANKS_BLOCKED) or {}
    after = get_condition(patch.get("conditions") or [], c.COND_RANKS_BLOCKED) or {}
    blocked = after.get("status") == "True"
    if blocked and (before.get("status"), before.get("reason"), before.get("message")) != (
            "True", after.get("reason"), after.get("message")):
        reason = str(after.get("reason"))
        # A new phase that only says the same (Pending/Starting with this cause as its reason) is this Event.
        events = [event for event in events if event[1] != reason]
        events.append(("Warning", reason, str(after.get("message"))))
    return [*events, *data_worker_events(status.get("conditions") or [], patch.get("conditions") or [])]
