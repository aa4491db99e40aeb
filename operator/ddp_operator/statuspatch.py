"""The status a job's decision leads to, as a merge patch: phase, counts, conditions, failure record.

Writes only the fields the operator owns; status.progress is rank 0's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from ddp_contract.jobspec import JobSpec
from ddp_contract.jobstatus import (
    STATUS_ATTEMPT,
    STATUS_ATTEMPT_CAUSE,
    STATUS_ATTEMPT_TIME,
    STATUS_CHECKPOINT_REQUESTED,
    STATUS_COMPLETION_TIME,
    STATUS_CONDITIONS,
    STATUS_DATA_WORKERS,
    STATUS_FAILED_RANK,
    STATUS_INFRASTRUCTURE_RESTARTS,
    STATUS_MEMBERS,
    STATUS_MESSAGE,
    STATUS_OBSERVED_GENERATION,
    STATUS_PHASE,
    STATUS_PROCESS_FAILURES,
    STATUS_PROGRAM_RESTARTS,
    STATUS_READY,
    STATUS_READY_PODS,
    STATUS_READY_RANKS,
    STATUS_REASON,
    STATUS_RECREATED_ATTEMPT,
    STATUS_RESTARTS,
    STATUS_START_TIME,
    STATUS_TOTAL_PODS,
    STATUS_TOTAL_RANKS,
    STATUS_WORLD_SIZE,
    StatusPatch,
)
from ddp_contract.resource import JobStatus
from ddp_contract.timestamps import rfc3339
from ddp_operator import constants as c
from ddp_operator import modes
from ddp_operator.conditions import get_condition, set_condition
from ddp_operator.dataworkers import data_worker_events
from ddp_operator.decision import Action, Decision
from ddp_operator.podsummary import PodSummary
from ddp_operator.policy import RESTART_COUNTERS
from ddp_operator.spec import InvalidSpec

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
    previous = status.get(STATUS_PHASE)
    if previous in c.TERMINAL_PHASES:
        return str(previous)
    if decision.action in DECISION_PHASE:
        return DECISION_PHASE[decision.action]
    regrouping = modes.of(spec).regrouping(JobStatus.of(status))
    if summary.ready > 0 and summary.ready + summary.succeeded >= summary.gang_pods(spec.pods) and not regrouping:
        return c.PHASE_RUNNING
    if previous == c.PHASE_RESTARTING:
        return c.PHASE_RESTARTING
    return c.PHASE_STARTING if summary.running > 0 else c.PHASE_PENDING


def compute_status(
    spec: JobSpec,
    *,
    status: Mapping[str, Any],
    summary: PodSummary,
    decision: Decision,
    now: datetime,
    generation: int | None = None,
) -> StatusPatch:
    """The status patch (merge-patch semantics: a None value removes the field).

    Writes only operator-owned fields; progress and kopf's own fields are left alone.
    """
    phase = next_phase(status, summary, decision, spec)
    stamp = rfc3339(now)
    reason, message = _reason_message(phase, status=status, summary=summary, decision=decision, spec=spec)
    per_pod, gang = spec.ranks_per_pod, summary.gang_pods(spec.pods)
    members = decision.members or summary.gang or tuple(range(spec.pods))
    patch: StatusPatch = {
        STATUS_PHASE: phase,
        STATUS_ATTEMPT: decision.attempt,
        STATUS_RECREATED_ATTEMPT: recreated_attempt(status, decision, spec),
        STATUS_ATTEMPT_TIME: attempt_time(status, decision, stamp),
        STATUS_RESTARTS: JobStatus.of(status).restarts + (1 if decision.action == Action.RESTART else 0),
        STATUS_READY_RANKS: summary.ready * per_pod,
        STATUS_TOTAL_RANKS: gang * per_pod,
        STATUS_READY_PODS: summary.ready,
        STATUS_TOTAL_PODS: gang,
        STATUS_READY: f"{summary.ready * per_pod}/{gang * per_pod}",
        STATUS_WORLD_SIZE: len(members) * per_pod,
        STATUS_REASON: reason,
        STATUS_MESSAGE: message,
        STATUS_START_TIME: _start_time(status, phase, stamp, decision),
        STATUS_COMPLETION_TIME: status.get(STATUS_COMPLETION_TIME) or (stamp if phase in c.TERMINAL_PHASES else None),
        STATUS_CONDITIONS: _conditions(status, phase=phase, reason=reason, message=message, summary=summary, decision=decision,
                                  now=now, generation=generation),
    }
    patch.update(_kind_restarts(status, decision))
    patch.update(modes.of(spec).membership_status(members, decision.checkpoint_wanted))
    if decision.action == Action.RESIZE:
        patch[STATUS_CONDITIONS] = _shrunk(patch[STATUS_CONDITIONS], decision=decision, short=len(members) < spec.pods, now=now,
                                      generation=generation)
    if decision.action in (Action.RESTART, Action.RESIZE):
        patch[STATUS_PROCESS_FAILURES] = None  # the attempt they were reported for is over
    if generation is not None:
        patch[STATUS_OBSERVED_GENERATION] = generation
    if decision.failure is not None and status.get(STATUS_PHASE) not in c.TERMINAL_PHASES:
        patch[STATUS_FAILED_RANK] = decision.failure.as_status()
    if decision.attempt != JobStatus.of(status).attempt:
        # In words the Event says too: rank 0 keeps them in S3 with the attempt, for when both are gone.
        patch[STATUS_ATTEMPT_CAUSE] = {STATUS_ATTEMPT: decision.attempt, "reason": reason, "message": message,
                                       "time": stamp}
    return patch


def recreated_attempt(status: Mapping[str, Any], decision: Decision, spec: JobSpec) -> int:
    """status.recreatedAttempt: the attempt whose pods were last all created anew. A Recreate restart
    moves it to the new attempt; an InPlace one keeps the pods that go on, and so the value."""
    if (decision.action == Action.RESTART and modes.of(spec).restart_recreates) or decision.action == Action.RECREATE:
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


def _kind_restarts(status: Mapping[str, Any], decision: Decision) -> StatusPatch:
    """programRestarts and infrastructureRestarts, the one the restart's failure draws on counted up."""
    failed = decision.failure.kind if decision.action == Action.RESTART and decision.failure is not None else None
    program, infrastructure = (int(status.get(RESTART_COUNTERS[kind], 0)) + (kind == failed)
                               for kind in (c.KIND_PROGRAM, c.KIND_INFRASTRUCTURE))
    return {STATUS_PROGRAM_RESTARTS: program, STATUS_INFRASTRUCTURE_RESTARTS: infrastructure}


# Fields of status this operator owns; progress is the trainer's.
OWNED_STATUS = frozenset({
    *RESTART_COUNTERS.values(), STATUS_PHASE, STATUS_ATTEMPT, STATUS_ATTEMPT_TIME, STATUS_ATTEMPT_CAUSE, STATUS_RECREATED_ATTEMPT,
    STATUS_PROCESS_FAILURES, STATUS_RESTARTS, STATUS_READY_RANKS, STATUS_TOTAL_RANKS, STATUS_READY_PODS,
    STATUS_TOTAL_PODS, STATUS_READY, STATUS_REASON, STATUS_WORLD_SIZE, STATUS_MEMBERS, STATUS_CHECKPOINT_REQUESTED,
    STATUS_MESSAGE, STATUS_START_TIME, STATUS_COMPLETION_TIME, STATUS_CONDITIONS, STATUS_OBSERVED_GENERATION,
    STATUS_FAILED_RANK, STATUS_DATA_WORKERS,
})
# What moves with every rank that becomes ready; a patch that changes nothing else may wait a little.
COUNT_FIELDS = frozenset({STATUS_READY_RANKS, STATUS_READY_PODS, STATUS_READY, STATUS_MESSAGE})


def changed_fields(current: Mapping[str, Any], patch: Mapping[str, Any]) -> frozenset[str]:
    """The operator-owned fields whose value the patch changes."""
    return frozenset(f for f in patch if f in OWNED_STATUS and current.get(f) != patch.get(f))


def only_counts_changed(current: Mapping[str, Any], patch: Mapping[str, Any]) -> bool:
    """Whether the patch changes rank counts and the messages quoting them, and nothing else:
    no phase, attempt or restart, and no condition's status or reason."""
    changed = changed_fields(current, patch)
    if not changed or not changed <= COUNT_FIELDS | {STATUS_CONDITIONS}:
        return False
    return _condition_states(current.get(STATUS_CONDITIONS)) == _condition_states(patch.get(STATUS_CONDITIONS))


def _condition_states(conditions: Iterable[Mapping[str, Any]] | None) -> list[tuple[Any, ...]]:
    return [(cond.get("type"), cond.get("status"), cond.get("reason"), cond.get("lastTransitionTime"),
             cond.get("observedGeneration")) for cond in conditions or []]


def invalid_spec_status(
    error: InvalidSpec, status: Mapping[str, Any], now: datetime, generation: int | None = None
) -> StatusPatch:
    """Status patch for a spec parse_spec refused: the job fails, the message names the field."""
    message = str(error)
    stamp = rfc3339(now)
    conditions = set_condition(
        status.get(STATUS_CONDITIONS) or [], c.COND_FAILED, status=True, reason=c.REASON_INVALID_SPEC, message=message, now=now,
        generation=generation,
    )
    patch: StatusPatch = {
        STATUS_PHASE: c.PHASE_FAILED,
        STATUS_REASON: c.REASON_INVALID_SPEC,
        STATUS_MESSAGE: message,
        STATUS_COMPLETION_TIME: status.get(STATUS_COMPLETION_TIME) or stamp,
        STATUS_CONDITIONS: conditions,
    }
    if generation is not None:
        patch[STATUS_OBSERVED_GENERATION] = generation
    return patch


def failed_pass_status(status: Mapping[str, Any], message: str) -> StatusPatch | None:
    """Status patch for a status pass that raised (passerrors.py): reason ReconcileError and why, the phase
    kept (Pending for a job that has none yet); the next pass that succeeds writes its own. None where
    the status says so already, or the job has ended: its reason stays why it ended."""
    if status.get(STATUS_PHASE) in c.TERMINAL_PHASES or (
            status.get(STATUS_REASON) == c.REASON_RECONCILE_ERROR and status.get(STATUS_MESSAGE) == message):
        return None
    return {STATUS_PHASE: status.get(STATUS_PHASE) or c.PHASE_PENDING, STATUS_REASON: c.REASON_RECONCILE_ERROR,
            STATUS_MESSAGE: message}


def _conditions(
    status: Mapping[str, Any],
    *,
    phase: str,
    reason: str,
    message: str,
    summary: PodSummary,
    decision: Decision,
    now: datetime,
    generation: int | None,
) -> list[dict[str, Any]]:
    conditions = [dict(cond) for cond in status.get(STATUS_CONDITIONS) or []]
    created = decision.action == Action.CREATE or summary.total > 0
    if created and get_condition(conditions, c.COND_CREATED) is None:
        conditions = set_condition(
            conditions, c.COND_CREATED, status=True, reason=c.REASON_CREATED, message="rank pods created", now=now,
            generation=generation,
        )
    cause, detail = summary.held_up if phase not in c.TERMINAL_PHASES else ("", "")
    if cause:
        conditions = set_condition(conditions, c.COND_RANKS_BLOCKED, status=True, reason=cause, message=detail, now=now,
                                   generation=generation)
    elif get_condition(conditions, c.COND_RANKS_BLOCKED) is not None:
        conditions = set_condition(conditions, c.COND_RANKS_BLOCKED, status=False, reason=c.REASON_NOT_BLOCKED, message="",
                                   now=now, generation=generation)
    active = PHASE_CONDITION.get(phase)
    for type_ in PHASE_CONDITION.values():
        if type_ == active:
            if phase == c.PHASE_RESTARTING and decision.action not in (Action.RESTART, Action.RESIZE):
                continue  # it keeps why the gang restarted; status.reason may say what holds the new gang up
            conditions = set_condition(conditions, type_, status=True, reason=reason, message=message, now=now,
                                       generation=generation)
        elif get_condition(conditions, type_) is not None:
            conditions = set_condition(conditions, type_, status=False, reason=reason, message=message, now=now,
                                       generation=generation)
    return conditions


def _shrunk(conditions: list[dict[str, Any]], *, decision: Decision, short: bool, now: datetime,
            generation: int | None) -> list[dict[str, Any]]:
    """The Shrunk condition after a resize: True with why while the gang is short of spec.worldSize."""
    if short:
        return set_condition(conditions, c.COND_SHRUNK, status=True, reason=decision.reason, message=decision.message, now=now,
                             generation=generation)
    return set_condition(conditions, c.COND_SHRUNK, status=False, reason=c.REASON_FULL_SIZE, message=decision.message, now=now,
                         generation=generation)


def _reason_message(
    phase: str, *, status: Mapping[str, Any], summary: PodSummary, decision: Decision, spec: JobSpec
) -> tuple[str, str]:
    if status.get(STATUS_PHASE) in c.TERMINAL_PHASES:
        return status.get(STATUS_REASON, ""), status.get(STATUS_MESSAGE, "")
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
        restarted = get_condition(status.get(STATUS_CONDITIONS) or [], c.COND_RESTARTING) or status
        return restarted.get("reason", ""), restarted.get("message", "")  # a condition's, or the status's
    return c.REASON_WAITING, waiting


def _start_time(status: Mapping[str, Any], phase: str, stamp: str, decision: Decision) -> str | None:
    """Set when the job first runs unsuspended (and admitted, in a Kueue queue); cleared by
    suspension and by waiting in the queue, so the deadline restarts."""
    if phase == c.PHASE_SUSPENDED or decision.action == Action.QUEUE:
        return None
    return status.get(STATUS_START_TIME) or stamp


WARNING_PHASES = frozenset({c.PHASE_FAILED, c.PHASE_RESTARTING})
RESIZE_EVENTS = {c.REASON_SHRUNK: "Warning", c.REASON_GROWN: "Normal"}


def events_for(status: Mapping[str, Any], patch: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """The Events a status change deserves, as (type, reason, message): a new phase, and ranks newly
    held up (or held up for another cause, or other ranks)."""
    events: list[tuple[str, str, str]] = []
    phase, reason = patch.get(STATUS_PHASE), patch.get(STATUS_REASON) or ""
    if phase and phase != status.get(STATUS_PHASE):
        kind = RESIZE_EVENTS.get(reason) or ("Warning" if phase in WARNING_PHASES else "Normal")
        events.append((kind, reason or phase, patch.get(STATUS_MESSAGE) or f"phase {phase}"))
    elif reason == c.REASON_IN_PLACE_TIMED_OUT != status.get(STATUS_REASON):
        events.append(("Warning", c.REASON_IN_PLACE_TIMED_OUT, str(patch.get(STATUS_MESSAGE))))
    elif reason in RESIZE_EVENTS and patch.get(STATUS_ATTEMPT) != status.get(STATUS_ATTEMPT):
        events.append((RESIZE_EVENTS[reason], reason, str(patch.get(STATUS_MESSAGE))))
    before = get_condition(status.get(STATUS_CONDITIONS) or [], c.COND_RANKS_BLOCKED) or {}
    after = get_condition(patch.get(STATUS_CONDITIONS) or [], c.COND_RANKS_BLOCKED) or {}
    blocked = after.get("status") == "True"
    if blocked and (before.get("status"), before.get("reason"), before.get("message")) != (
            "True", after.get("reason"), after.get("message")):
        reason = str(after.get("reason"))
        # A new phase that only says the same (Pending/Starting with this cause as its reason) is this Event.
        events = [event for event in events if event[1] != reason]
        events.append(("Warning", reason, str(after.get("message"))))
    return [*events, *data_worker_events(status.get(STATUS_CONDITIONS) or [], patch.get(STATUS_CONDITIONS) or [])]
