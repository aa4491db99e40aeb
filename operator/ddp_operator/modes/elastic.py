"""Elastic world size (spec.minWorldSize below spec.worldSize): which pods make the next gang.

Every pod of the job exists ('<job>-0' .. '<job>-<pods-1>'); status.members names the ones in the
current attempt's gang, in rank order. The others wait apart (WaitingPods): Pending, where they find
out whether there is room for them, or Running, where their runtime waits to be taken in. A resize is
a new attempt with other members, carried out in place:
  shrink: members that do not fit (Unschedulable, a gang too large, a quota) are left out, at once
          once the gang has formed before, after elasticSettleSeconds at the job's start; never
          below the minimum, where the job waits as any other would
  grow:   pods that run but are not members are taken in at the job's next checkpoint (at once
          while the gang is re-forming anyway), once none is still starting (scheduled, or not yet
          judged by the scheduler), so pods coming up together join in one resize; meanwhile
          status.checkpointRequested asks rank 0 for a checkpoint at its next step, and the first
          checkpoint past the step the job had when it asked is the one grown at (steps, not clocks:
          the operator's and rank 0's clocks differ, and a checkpoint may fall in the second asked)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ddp_contract.jobspec import JobSpec
from ddp_contract.resource import JobStatus
from ddp_contract.timestamps import parse_rfc3339, rfc3339
from ddp_operator import constants as c
from ddp_operator.failures import PodProblem
from ddp_operator.gangpods import GangPods
from ddp_operator.manifests import pod_name
from ddp_operator.podstate import PodView, rank_problem

# Why a member's pod does not fit: the scheduler found no node, or the namespace's quota has no room.
DOES_NOT_FIT = frozenset({c.REASON_UNSCHEDULABLE, c.REASON_GANG_TOO_LARGE, c.REASON_QUOTA_EXCEEDED})


@dataclass(frozen=True)
class WaitingPods:
    """An elastic job's current pods outside the attempt's gang, not being deleted. Never a failure of
    the gang: they wait to be taken in."""

    names: tuple[str, ...] = ()  # pending or running
    running: frozenset[int] = frozenset()  # their indices, where the trainer container runs
    pending: frozenset[int] = frozenset()  # their indices, where it does not run yet
    ended: tuple[str, ...] = ()  # finished, or on a lost node: replaced, to wait on again
    problems: tuple[PodProblem, ...] = ()  # why pending ones wait

    def without(self, indices: Iterable[int]) -> WaitingPods:
        """These pods with what was said of `indices` forgotten (a new problem replaces it)."""
        gone = set(indices)
        return WaitingPods(self.names, self.running, self.pending, self.ended,
                           tuple(p for p in self.problems if p.index not in gone))


def waiting_pods(current: Iterable[PodView], members: Sequence[int], lost_nodes: Mapping[str, str]) -> WaitingPods:
    """The pods of `current` (those the attempt window holds) outside the gang's `members`."""
    gang = frozenset(members)
    apart = [p for p in current if p.index not in gang and not p.deleting]
    ended = [p for p in apart if not p.active or p.node in lost_nodes]
    waiting = [p for p in apart if p.active and p.node not in lost_nodes]
    problems = [found for p in waiting if p.state != "running" and p.index is not None
                and (found := rank_problem(p.pod, p.index))]
    return WaitingPods(names=tuple(sorted(p.name for p in waiting)),
                       running=frozenset(p.index for p in waiting if p.state == "running" and p.index is not None),
                       pending=frozenset(p.index for p in waiting if p.state != "running" and p.index is not None),
                       ended=tuple(sorted(p.name for p in ended)),
                       problems=tuple(sorted(problems, key=lambda p: p.index)))


@dataclass(frozen=True)
class CheckpointRequest:
    """status.checkpointRequested: a grow waits for a checkpoint, asked for since a time, when the job's
    last checkpoint was after_step (None: it had none). A checkpoint at a later step answers it."""

    since: str
    after_step: int | None

    @classmethod
    def of(cls, value: object) -> CheckpointRequest | None:
        if not isinstance(value, Mapping) or not isinstance(value.get("since"), str):
            return None
        after = value.get("afterStep")
        return cls(value["since"], after if isinstance(after, int) else None)

    def as_status(self) -> dict[str, Any]:
        # A request is only ever set where none was (merge patch), so a missing afterStep stays missing.
        return {"since": self.since} | ({} if self.after_step is None else {"afterStep": self.after_step})

    def answered_by(self, step: int | None) -> bool:
        return step is not None and (self.after_step is None or step > self.after_step)


@dataclass(frozen=True)
class Resize:
    members: tuple[int, ...]
    reason: str  # REASON_SHRUNK or REASON_GROWN
    message: str
    recheck_after: float | None = None  # a shrink waiting for elasticSettleSeconds: seconds left
    checkpoint_wanted: CheckpointRequest | None = None  # a grow waiting for a checkpoint

    @property
    def due(self) -> bool:
        """Whether the gang re-forms now (else it waits recheck_after for the settle time to pass)."""
        return bool(self.reason)


def members(spec: JobSpec, status: JobStatus) -> tuple[int, ...]:
    """The current attempt's gang: status.members for an elastic job that has one, else every pod."""
    recorded = status.members if spec.elastic else None
    if recorded and max(recorded) < spec.pods:
        return tuple(sorted(recorded))
    return tuple(range(spec.pods))


def restart_members(spec: JobSpec, pods: GangPods, waiting: WaitingPods) -> tuple[int, ...]:
    """The gang of an attempt a failure starts: the members, and any pod already running to be taken
    in (the gang re-forms anyway)."""
    return tuple(sorted(set(pods.gang or range(spec.pods)) | waiting.running))


def resize(spec: JobSpec, *, status: JobStatus, pods: GangPods, waiting: WaitingPods,
           now: datetime) -> Resize | None:
    """A shrink or a grow the gang is due, if any (see the module's docstring)."""
    gang = pods.gang or tuple(range(spec.pods))
    return (_shrink(spec, status=status, summary=pods, gang=gang, now=now)
            or _grow(spec, status=status, summary=pods, waiting=waiting, gang=gang, now=now))


def _shrink(spec: JobSpec, *, status: JobStatus, summary: GangPods, gang: Sequence[int],
            now: datetime) -> Resize | None:
    misfits = {p.index: p for p in summary.problems if p.reason in DOES_NOT_FIT and p.index in gang}
    if not misfits:
        return None
    fit = tuple(i for i in gang if i not in misfits)
    placed = all(i in summary.live_indices and i not in summary.unscheduled_indices for i in fit)
    if len(fit) < spec.min_pods or not placed:
        return None  # below the minimum the job waits for them; or the scheduler has yet to place the rest
    left = _settle_left(spec, status, now)
    if left is not None and left > 0:
        return Resize(tuple(gang), "", "", recheck_after=left)
    held = "; ".join(f"{pod_name(summary.job_name, i)}: {p.message or p.reason}" for i, p in sorted(misfits.items()))
    per_pod = spec.ranks_per_pod
    message = (f"world size {len(gang) * per_pod} -> {len(fit) * per_pod} of {spec.world_size}: "
               f"{len(misfits)} pod{'s' if len(misfits) > 1 else ''} do not fit ({held}); the gang goes on without "
               "them and grows back once they run")
    return Resize(fit, c.REASON_SHRUNK, message)


def _grow(spec: JobSpec, *, status: JobStatus, summary: GangPods, waiting: WaitingPods,
          gang: Sequence[int], now: datetime) -> Resize | None:
    starting = waiting.pending - {p.index for p in waiting.problems}
    if not waiting.running or starting:
        return None  # pods still on their way in join this resize rather than force another
    bigger = tuple(sorted(set(gang) | waiting.running))
    per_pod = spec.ranks_per_pod
    joining = ", ".join(pod_name(summary.job_name, i) for i in sorted(waiting.running))
    head = f"world size {len(gang) * per_pod} -> {len(bigger) * per_pod} of {spec.world_size}: {joining} running"
    if status.phase != c.PHASE_RUNNING:
        return Resize(bigger, c.REASON_GROWN, f"{head}; taken into the gang being formed")
    step = status.checkpoint_step
    asked = CheckpointRequest.of(status.checkpoint_requested)
    if asked is None or not asked.answered_by(step):
        # Grown at the next checkpoint, so no step is trained twice; rank 0 is asked for one.
        return Resize(tuple(gang), "", "", checkpoint_wanted=asked or CheckpointRequest(rfc3339(now), step))
    return Resize(bigger, c.REASON_GROWN, f"{head}; the gang re-forms from the checkpoint at step {step}")


def _settle_left(spec: JobSpec, status: JobStatus, now: datetime) -> float | None:
    """Seconds a gang that never formed still waits for ranks that do not fit; None: it formed before."""
    if status.gang_reported:
        return None
    started = parse_rfc3339(status.start_time)
    if started is None:
        return float(spec.elastic_settle_seconds)
    return spec.elastic_settle_seconds - (now - started).total_seconds()
