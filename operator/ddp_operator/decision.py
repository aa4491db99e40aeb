"""What to do next for a job, from its spec, its recorded status and its pods: the one decision a pass acts on."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Any

from ddp_contract.jobspec import JobSpec
from ddp_contract.resource import JobStatus
from ddp_contract.timestamps import parse_rfc3339
from ddp_operator import constants as c
from ddp_operator import modes
from ddp_operator.deadlines import deadline_exceeded, startup_remaining
from ddp_operator.failures import RankFailure, describe_problems
from ddp_operator.kueue.rules import Gate, QueueState
from ddp_operator.manifests import pod_name
from ddp_operator.modes import elastic, inplace, spares
from ddp_operator.podsummary import PodSummary
from ddp_operator.policy import BUDGET_FIELDS, RESTART_COUNTERS, budget, is_retryable, repeats_previous


class Action(enum.StrEnum):
    CREATE = "Create"  # create decision.create_indices
    WAIT = "Wait"  # nothing to create; maybe pods to delete (old attempts, leftovers of a finished job)
    RESTART = "Restart"  # delete the gang (InPlace: the pods that cannot go on); the next passes create attempt + 1
    RECREATE = "Recreate"  # an InPlace restart overdue: delete the pods kept from earlier attempts, same attempt
    RESIZE = "Resize"  # an elastic job's gang re-forms in place with decision.members, on no restart budget
    FAIL = "Fail"
    SUCCEED = "Succeed"
    SUSPEND = "Suspend"
    QUEUE = "Queue"  # wait for Kueue to admit the gang, without pods


@dataclass(frozen=True)
class Decision:
    action: Action
    attempt: int  # the gang attempt after this decision: label new pods with it, store it in status
    reason: str = ""
    message: str = ""
    create_indices: tuple[int, ...] = ()
    delete_pods: tuple[str, ...] = ()
    failure: RankFailure | None = None
    recheck_after: float | None = None  # seconds until the decision should be taken again
    members: tuple[int, ...] | None = None  # elastic jobs: the gang of decision.attempt, when it changes
    checkpoint_wanted: elastic.CheckpointRequest | None = None  # elastic jobs: a grow waits for a checkpoint


@dataclass(frozen=True)
class Pass:
    """What one decision is taken from. queue: for a job in a Kueue queue, what its Workload allows."""

    spec: JobSpec
    status: JobStatus
    summary: PodSummary
    now: datetime
    queue: QueueState | None = None

    @property
    def attempt(self) -> int:
        return self.summary.attempt

    @cached_property
    def mode(self) -> modes.Mode:
        return modes.of(self.spec)

    @cached_property
    def in_place_left(self) -> float | None:
        """Seconds left for an InPlace restart's kept gang to form (modes/inplace.py)."""
        return self.mode.deadline_left(status=self.status, pods=self.summary, kept=self.summary.kept, now=self.now)

    @cached_property
    def resized(self) -> elastic.Resize | None:
        return self.mode.resize(status=self.status, pods=self.summary, waiting=self.summary.waiting, now=self.now)


def decide(spec: JobSpec, *, status: Mapping[str, Any], summary: PodSummary, now: datetime,
           queue: QueueState | None = None) -> Decision:
    """What to do next: the first of RULES that decides, else create the pods whose names are free.
    Success means every rank's trainer exited 0 (not just rank 0): a rank still running may be writing
    results. Any failed rank ends the attempt for the whole gang.

    queue: for a job in a Kueue queue, what its Workload allows; a gang not admitted (or evicted)
    has no pods, and its pods going is no failure."""
    taken_from = Pass(spec, JobStatus.of(status), summary, now, queue)
    for rule in RULES:
        decision = rule(taken_from)
        if decision is not None:
            return decision
    return _create(taken_from)


def _finished(p: Pass) -> Decision | None:
    """Stop whatever still runs (a failed gang's survivors); keep finished pods for their logs."""
    if p.status.phase not in c.TERMINAL_PHASES:
        return None
    left = p.mode.exit_grace_left(p.status, p.now)
    keep = (p.status.failed_rank or {}).get("pod") if left is not None else None
    return Decision(Action.WAIT, p.attempt, p.status.reason, p.status.message,
                    delete_pods=tuple(n for n in p.summary.running_pods if n != keep), recheck_after=left)


def _past_deadline(p: Pass) -> Decision | None:
    if not deadline_exceeded(p.status, p.spec, p.now):
        return None
    message = f"activeDeadlineSeconds={p.spec.active_deadline_seconds} passed since {p.status.start_time}"
    return _fail(p.summary, c.REASON_DEADLINE, message)


def _suspended(p: Pass) -> Decision | None:
    if not p.spec.suspend:
        return None
    return Decision(Action.SUSPEND, p.attempt, c.REASON_SUSPENDED, "spec.suspend is true",
                    delete_pods=p.summary.every_pod())


def _succeeded(p: Pass) -> Decision | None:
    gang = p.summary.gang_pods(p.spec.pods)
    if p.summary.succeeded != gang:
        return None
    return Decision(Action.SUCCEED, p.attempt, c.REASON_SUCCEEDED, f"all {gang * p.spec.ranks_per_pod} ranks exited 0")


def _not_admitted(p: Pass) -> Decision | None:
    if p.queue is None or p.queue.gate == Gate.ADMITTED:
        return None
    action = Action.SUSPEND if p.queue.gate == Gate.EVICTED else Action.QUEUE
    return Decision(action, p.attempt, p.queue.reason, p.queue.message, delete_pods=p.summary.every_pod())


def _failed(p: Pass) -> Decision | None:
    failure = p.summary.failure or _lost_rank(p.spec, p.status, p.summary)
    if failure is None:
        return None
    wait = _echo_wait(failure, p.now)
    if wait is not None:
        return Decision(Action.WAIT, p.attempt, delete_pods=p.summary.replaced_anyway, recheck_after=wait)
    return _on_failure(p, failure)


def _in_place_overdue(p: Pass) -> Decision | None:
    if p.in_place_left is None or p.in_place_left > 0:
        return None
    reason, message, replaced = inplace.overdue(p.spec, p.summary, p.summary.kept)
    return Decision(Action.RECREATE, p.attempt, reason, message, delete_pods=replaced)


def _refused(p: Pass) -> Decision | None:
    """Refused by the cluster's rules (Pod Security, a LimitRange, a policy, ...): waiting cannot help."""
    at_once = [problem for problem in p.summary.problems if problem.reason in c.FAIL_AT_ONCE_REASONS]
    if not at_once:
        return None
    return _fail(p.summary, *describe_problems(at_once, "rank" if p.spec.ranks_per_pod == 1 else "pod"))


def _resize_due(p: Pass) -> Decision | None:
    if p.resized is None or not p.resized.due:
        return None
    return Decision(Action.RESIZE, p.attempt + 1, p.resized.reason, p.resized.message,
                    delete_pods=p.summary.replaced_anyway, members=p.resized.members)


def _held_past_startup(p: Pass) -> Decision | None:
    """Held up past the startup deadline: fail with the cause, so the other ranks free what they hold."""
    remaining = startup_remaining(p.status, p.spec, p.now) if p.summary.problems else None
    if remaining is None or remaining > 0:
        return None
    cause, detail = p.summary.held_up
    return _fail(p.summary, cause, f"{detail}; still so after startupDeadlineSeconds={p.spec.startup_deadline_seconds}")


def _partly_refused_by_quota(p: Pass) -> Decision | None:
    """Part of the gang was created before a quota refused the rest: its pods hold what the others
    need and cannot train alone, so they go; the whole gang is created once the quota has room. An
    elastic job's part that reaches its minimum stays (it starts without the rest), judged by what was
    refused: the pods just created may not all be in the watch's cache yet."""
    refused = {problem.index for problem in p.summary.problems if problem.reason == c.REASON_QUOTA_EXCEEDED}
    gang = p.summary.gang_pods(p.spec.pods)
    if not (p.summary.active_pods and refused) or p.mode.part_may_start(gang - len(refused)):
        return None
    return Decision(Action.WAIT, p.attempt, delete_pods=p.summary.every_pod())


def _create(p: Pass) -> Decision:
    free = tuple(r for r in range(p.spec.all_pods) if r not in p.summary.taken_indices)
    due = [t for t in (p.in_place_left, p.resized.recheck_after if p.resized else None) if t is not None]
    return Decision(Action.CREATE if free else Action.WAIT, p.attempt, delete_pods=p.summary.replaced_anyway,
                    create_indices=free, recheck_after=min(due) if due else None,
                    checkpoint_wanted=p.resized.checkpoint_wanted if p.resized else None)


# In order: the first that decides wins.
RULES: tuple[Callable[[Pass], Decision | None], ...] = (
    _finished, _past_deadline, _suspended, _succeeded, _not_admitted, _failed, _in_place_overdue, _refused,
    _resize_due, _held_past_startup, _partly_refused_by_quota,
)


def _on_failure(p: Pass, failure: RankFailure) -> Decision:
    """Restart the gang on the budget of the failure's kind (program: backoffLimit; infrastructure:
    infrastructureBackoffLimit), unless the policy says no, the budget is spent, or the program
    failed exactly as on the attempt before."""
    spec, status, summary, kind = p.spec, p.status, p.summary, failure.kind
    if not is_retryable(spec.restart_policy, failure):
        message = f"{failure.describe()}; restartPolicy {spec.restart_policy} does not retry it"
        return _fail(summary, c.REASON_PERMANENT, message, failure)
    if repeats_previous(status.failed_rank, failure):
        message = (f"{failure.describe()}; attempt {summary.attempt - 1} failed with the same error at the same step, "
                   "so retrying would fail again: fix the program and create the job again")
        return _fail(summary, c.REASON_DETERMINISTIC, message, failure)
    used, limit = status.count(RESTART_COUNTERS[kind]), budget(spec, kind)
    if used >= limit:
        message = (f"{failure.describe()}; {BUDGET_FIELDS[kind]} {limit} reached after {used} "
                   f"{kind.lower()} restarts")
        return _fail(summary, c.REASON_BACKOFF_LIMIT, message, failure)
    message = (f"{failure.describe()}; restarting {p.mode.restarting} ({kind.lower()} restart {used + 1} of {limit}, "
               f"{BUDGET_FIELDS[kind]})")
    replaced = p.mode.replaced_by_restart(summary, running=summary.running_pods, anyway=summary.replaced_anyway)
    members = p.mode.restart_members(summary, summary.waiting)
    taken = spares.takeovers(spec, summary.job_name, summary.gang, members or ())
    return Decision(
        Action.RESTART, summary.attempt + 1, _restart_reason(failure), f"{message}; {taken}" if taken else message,
        delete_pods=replaced, failure=failure, members=members,
    )


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
                    delete_pods=tuple(p for p in summary.running_pods if p != keep))


def _lost_rank(spec: JobSpec, status: JobStatus, summary: PodSummary) -> RankFailure | None:
    """A rank whose pod vanished after the gang formed cannot rejoin: treat it as a lost pod.

    Before the gang formed (phase not yet Running), a missing rank is simply created again: the
    others are still waiting for it at the rendezvous.
    """
    if status.phase != c.PHASE_RUNNING or status.attempt != summary.attempt:
        return None
    missing = [r for r in summary.gang or range(spec.pods) if r not in summary.live_indices]
    if not missing:
        return None
    name = pod_name(summary.job_name, missing[0]) if summary.job_name else ""
    return RankFailure(pod_index=missing[0], pod=name, exit_code=None, reason=c.REASON_RANK_MISSING, evicted=True,
                       ranks_per_pod=spec.ranks_per_pod, attempt=summary.attempt, node=summary.nodes_seen.get(name))


