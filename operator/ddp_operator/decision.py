"""What to do next for a job, from its spec, its recorded status and its pods: the one decision a pass acts on."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ddp_contract.timestamps import parse_rfc3339
from ddp_operator import constants as c
from ddp_operator import elastic
from ddp_operator.conditions import get_condition
from ddp_operator.deadlines import deadline_exceeded, startup_remaining
from ddp_operator.failures import RankFailure, describe_problems
from ddp_operator.kueue.rules import Gate, QueueState
from ddp_operator.manifests import pod_name
from ddp_operator.podsummary import PodSummary
from ddp_operator.policy import BUDGET_FIELDS, RESTART_COUNTERS, budget, is_retryable, repeats_previous
from ddp_operator.spec import JobSpec


class Action(enum.StrEnum):
    CREATE = "Create"  # create decision.create_ranks
    WAIT = "Wait"  # nothing to create; maybe pods to delete (old attempts, leftovers of a finished job)
    RESTART = "Restart"  # delete the gang (InPlace: the pods that cannot go on); the next passes create attempt + 1
    RECREATE = "Recreate"  # an InPlace restart overdue: delete the pods kept from earlier attempts, same attempt
    RESIZE = "Resize"  # an elastic job's gang re-forms in place with decision.members, on no restart budget
    FAIL = "Fail"
    SUCCEED = "Succeed"
    SUSPEND = "Suspend"
    QUEUE = "Queue"  # wait for Kueue to admit the gang, without pods


# How long a failed job waits for the pod of a rank process that failed in place to end by itself.
IN_PLACE_EXIT_GRACE_SECONDS = 30.0


@dataclass(frozen=True)
class Decision:
    action: Action
    attempt: int  # the gang attempt after this decision: label new pods with it, store it in status
    reason: str = ""
    message: str = ""
    create_ranks: tuple[int, ...] = ()
    delete_pods: tuple[str, ...] = ()
    failure: RankFailure | None = None
    recheck_after: float | None = None  # seconds until the decision should be taken again
    members: tuple[int, ...] | None = None  # elastic jobs: the gang of decision.attempt, when it changes
    checkpoint_wanted: elastic.CheckpointRequest | None = None  # elastic jobs: a grow waits for a checkpoint


def decide(spec: JobSpec, status: Mapping[str, Any], summary: PodSummary, now: datetime,
           queue: QueueState | None = None) -> Decision:
    """What to do next. Success means every rank's trainer exited 0 (not just rank 0): a rank still
    running may be writing results. Any failed rank ends the attempt for the whole gang.

    queue: for a job in a Kueue queue, what its Workload allows; a gang not admitted (or evicted)
    has no pods, and its pods going is no failure."""
    attempt = summary.attempt
    phase = status.get("phase")
    if phase in c.TERMINAL_PHASES:
        # Stop whatever still runs (a failed gang's survivors); keep finished pods for their logs.
        left = _exit_grace_left(spec, status, now)
        keep = (status.get("failedRank") or {}).get("pod") if left is not None else None
        return Decision(Action.WAIT, attempt, status.get("reason", ""), status.get("message", ""),
                        delete_pods=tuple(p for p in _running(summary) if p != keep), recheck_after=left)
    if deadline_exceeded(status, spec, now):
        message = f"activeDeadlineSeconds={spec.active_deadline_seconds} passed since {status.get('startTime')}"
        return _fail(summary, c.REASON_DEADLINE, message)
    if spec.suspend:
        return Decision(
            Action.SUSPEND, attempt, c.REASON_SUSPENDED, "spec.suspend is true", delete_pods=_whole_gang(summary)
        )
    gang = summary.gang_pods(spec.pods)
    if summary.succeeded == gang:
        return Decision(Action.SUCCEED, attempt, c.REASON_SUCCEEDED, f"all {gang * spec.ranks_per_pod} ranks exited 0")
    if queue is not None and queue.gate != Gate.ADMITTED:
        action = Action.SUSPEND if queue.gate == Gate.EVICTED else Action.QUEUE
        return Decision(action, attempt, queue.reason, queue.message, delete_pods=_whole_gang(summary))
    failure = summary.failure or _lost_rank(spec, status, summary)
    if failure is not None:
        wait = _echo_wait(failure, now)
        if wait is not None:
            return Decision(Action.WAIT, attempt, delete_pods=_replaced_anyway(summary), recheck_after=wait)
        return _on_failure(spec, status, summary, failure)
    in_place_left = _in_place_due(spec, status, summary, now)
    if in_place_left is not None and in_place_left <= 0:
        return _in_place_overdue(spec, summary)
    at_once = [problem for problem in summary.problems if problem.reason in c.FAIL_AT_ONCE_REASONS]
    if at_once:
        # Refused by the cluster's rules (Pod Security, a LimitRange, a policy, ...): waiting cannot help.
        return _fail(summary, *describe_problems(at_once, "rank" if spec.ranks_per_pod == 1 else "pod"))
    resized = elastic.resize(spec, status, summary, now)
    if resized is not None and resized.due:
        return Decision(Action.RESIZE, attempt + 1, resized.reason, resized.message,
                        delete_pods=_replaced_anyway(summary), members=resized.members)
    remaining = startup_remaining(status, spec, now) if summary.problems else None
    if remaining is not None and remaining <= 0:
        # Held up past the startup deadline: fail with the cause, so the other ranks free what they hold.
        cause, detail = summary.held_up
        return _fail(summary, cause, f"{detail}; still so after startupDeadlineSeconds={spec.startup_deadline_seconds}")
    refused = {problem.rank for problem in summary.problems if problem.reason == c.REASON_QUOTA_EXCEEDED}
    if summary.active_pods and refused and not (spec.elastic and gang - len(refused) >= spec.min_pods):
        # Part of the gang was created before a quota refused the rest: its pods hold what the others
        # need and cannot train alone, so they go; the whole gang is created once the quota has room.
        # An elastic job's part that reaches its minimum stays (it starts without the rest), judged by
        # what was refused: the pods just created may not all be in the watch's cache yet.
        return Decision(Action.WAIT, attempt, delete_pods=_whole_gang(summary))
    free = tuple(r for r in range(spec.pods) if r not in summary.occupied_ranks)
    action = Action.CREATE if free else Action.WAIT
    due = [t for t in (in_place_left, resized.recheck_after if resized else None) if t is not None]
    return Decision(action, attempt, delete_pods=_replaced_anyway(summary), create_ranks=free,
                    recheck_after=min(due) if due else None,
                    checkpoint_wanted=resized.checkpoint_wanted if resized else None)


def _on_failure(spec: JobSpec, status: Mapping[str, Any], summary: PodSummary, failure: RankFailure) -> Decision:
    """Restart the gang on the budget of the failure's kind (program: backoffLimit; infrastructure:
    infrastructureBackoffLimit), unless the policy says no, the budget is spent, or the program
    failed exactly as on the attempt before."""
    kind = failure.kind
    if not is_retryable(spec.restart_policy, failure):
        message = f"{failure.describe()}; restartPolicy {spec.restart_policy} does not retry it"
        return _fail(summary, c.REASON_PERMANENT, message, failure)
    if repeats_previous(status.get("failedRank"), failure):
        message = (f"{failure.describe()}; attempt {summary.attempt - 1} failed with the same error at the same step, "
                   "so retrying would fail again: fix the program and create the job again")
        return _fail(summary, c.REASON_DETERMINISTIC, message, failure)
    used, limit = int(status.get(RESTART_COUNTERS[kind], 0)), budget(spec, kind)
    if used >= limit:
        message = (f"{failure.describe()}; {BUDGET_FIELDS[kind]} {limit} reached after {used} "
                   f"{kind.lower()} restarts")
        return _fail(summary, c.REASON_BACKOFF_LIMIT, message, failure)
    how = "in place" if spec.in_place else "the gang"
    message = (f"{failure.describe()}; restarting {how} ({kind.lower()} restart {used + 1} of {limit}, "
               f"{BUDGET_FIELDS[kind]})")
    replaced = _cannot_go_on(summary) if spec.in_place else _whole_gang(summary)
    return Decision(
        Action.RESTART, summary.attempt + 1, _restart_reason(failure), message, delete_pods=replaced, failure=failure,
        members=elastic.restart_members(spec, summary),
    )


def gang_formed(status: Mapping[str, Any]) -> bool:
    """Whether rank 0 recorded the current attempt's gang forming (status.rendezvous)."""
    formed = (status.get("rendezvous") or {}).get("attempt")
    return isinstance(formed, int) and formed >= int(status.get("attempt", 0))


def _in_place_due(spec: JobSpec, status: Mapping[str, Any], summary: PodSummary, now: datetime) -> float | None:
    """Seconds left for an InPlace restart's gang to form, counted from when the restart was decided
    (status.attemptTime; the Restarting condition's time for a status written before it) or, later,
    the last of its pods started running; None when no such restart is waiting on pods it kept."""
    if not spec.in_place or status.get("phase") != c.PHASE_RESTARTING or gang_formed(status):
        return None
    if not summary.carried_pods or summary.running < summary.gang_pods(spec.pods):
        return None  # a rank still pending is held up for its own reasons, reported as such
    restarted = get_condition(status.get("conditions") or [], c.COND_RESTARTING) or {}
    since = [t for t in (parse_rfc3339(restarted.get("lastTransitionTime")), parse_rfc3339(summary.last_started),
                         parse_rfc3339(status.get(c.STATUS_ATTEMPT_TIME))) if t is not None]
    if not since:
        return None
    return spec.in_place_deadline_seconds - (now - max(since)).total_seconds()


def _in_place_overdue(spec: JobSpec, summary: PodSummary) -> Decision:
    """An InPlace restart whose gang did not form within inPlaceDeadlineSeconds of all its pods
    running (a rank process that cannot be stopped, a runtime that never starts its rank again): the
    pods kept from earlier attempts are recreated, for the same attempt, on no budget."""
    message = (f"the gang of attempt {summary.attempt} did not form within inPlaceDeadlineSeconds="
               f"{spec.in_place_deadline_seconds} of all its pods running; recreating the pods kept from earlier "
               f"attempts: {', '.join(summary.carried_pods)}")
    return Decision(Action.RECREATE, summary.attempt, c.REASON_IN_PLACE_TIMED_OUT, message,
                    delete_pods=summary.carried_pods)


def _echo_wait(failure: RankFailure, now: datetime) -> float | None:
    """Seconds to wait for the rank whose death broke this rank's collective to report its own
    failure (the cause, which decides the budget and a deterministic verdict); None: act now."""
    finished = parse_rfc3339(failure.finished_at)
    grace = failure.echo_grace_s
    if grace is None or finished is None:
        return None
    left = grace - (now - finished).total_seconds()
    return left if left > 0 else None


def _restart_reason(failure: RankFailure) -> str:
    if failure.reason in (c.REASON_HUNG, c.REASON_NODE_LOST):
        return failure.reason
    return c.REASON_RANK_EVICTED if failure.evicted else c.REASON_RANK_FAILED


def _fail(summary: PodSummary, reason: str, message: str, failure: RankFailure | None = None) -> Decision:
    # A rank process that failed in place keeps its pod: its runtime ends the container with the
    # process's code once the job is Failed, so the pod and its log stay, as a failed container's do.
    keep = failure.pod if failure is not None and failure.in_place else None
    return Decision(Action.FAIL, summary.attempt, reason, message, failure=failure,
                    delete_pods=tuple(p for p in _running(summary) if p != keep))


def _exit_grace_left(spec: JobSpec, status: Mapping[str, Any], now: datetime) -> float | None:
    """Seconds the pod of a rank process that failed in place (InPlace) still has to end on its own
    after the job failed; None once past it, or when there is no such pod to wait for."""
    completed = parse_rfc3339(status.get("completionTime"))
    if not spec.in_place or completed is None or status.get("phase") != c.PHASE_FAILED:
        return None
    left = IN_PLACE_EXIT_GRACE_SECONDS - (now - completed).total_seconds()
    return left if left > 0 else None


def _lost_rank(spec: JobSpec, status: Mapping[str, Any], summary: PodSummary) -> RankFailure | None:
    """A rank whose pod vanished after the gang formed cannot rejoin: treat it as a lost pod.

    Before the gang formed (phase not yet Running), a missing rank is simply created again: the
    others are still waiting for it at the rendezvous.
    """
    if status.get("phase") != c.PHASE_RUNNING or int(status.get("attempt", 0)) != summary.attempt:
        return None
    missing = [r for r in summary.gang or range(spec.pods) if r not in summary.live_ranks]
    if not missing:
        return None
    name = pod_name(summary.job_name, missing[0]) if summary.job_name else ""
    return RankFailure(rank=missing[0], pod=name, exit_code=None, reason=c.REASON_RANK_MISSING, evicted=True,
                       ranks_per_pod=spec.ranks_per_pod)


def _cannot_go_on(summary: PodSummary) -> tuple[str, ...]:
    """restartStrategy InPlace: the pods a restart replaces: those whose trainer container ended
    (failed, succeeded or evicted), those on a lost node, and older ones. The runtime in every other
    pod starts its rank processes again for the next attempt."""
    return tuple(sorted(set(summary.finished_pods + summary.on_lost_nodes + _replaced_anyway(summary))))


def _whole_gang(summary: PodSummary) -> tuple[str, ...]:
    """Every pod not already being deleted: the current attempt (finished or not) and older ones."""
    return tuple(sorted(set(_running(summary) + summary.finished_pods + _replaced_anyway(summary))))


def _running(summary: PodSummary) -> tuple[str, ...]:
    """Pods whose trainer still runs or waits to: the gang's, and an elastic job's waiting pods."""
    return summary.active_pods + summary.probes


def _replaced_anyway(summary: PodSummary) -> tuple[str, ...]:
    """Pods deleted whatever else happens: older attempts', and an elastic job's waiting pods that
    ended or are on a lost node (created again, to wait on)."""
    return summary.stale_pods + summary.dead_probes
