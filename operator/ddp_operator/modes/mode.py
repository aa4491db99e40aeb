"""A job's restart mode as one object, picked once from its spec (`of`): what the rest of the operator
asks of the mode (the decision, the status patch, the reading of the pods, the creation pass), each
question answered by the mode's room (recreate.py, inplace.py, elastic.py), so no module outside
modes/ asks the spec which mode it is.

    Recreate  a restart deletes the whole gang; the next attempt is new pods
    InPlace   a restart replaces only the pods that cannot go on; a kept gang forms again in time
    Elastic   InPlace with a gang of status.members, which resizes (spec.minWorldSize below worldSize,
              which the spec allows only with restartStrategy InPlace)
    Spared    InPlace with spare pods (spec.sparePods): a gang of status.members, a spare taking a lost
              pod's place
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar

from ddp_contract.jobspec import JobSpec
from ddp_contract.jobstatus import STATUS_CHECKPOINT_REQUESTED, STATUS_MEMBERS, StatusPatch
from ddp_contract.resource import JobStatus
from ddp_operator import constants as c
from ddp_operator.gangpods import GangPods
from ddp_operator.modes import elastic, inplace, recreate, spares


@dataclass(frozen=True)
class Mode(ABC):
    """What every mode answers; the defaults are a mode's that keeps no pod across attempts and has no
    members of its own."""

    spec: JobSpec
    # How a restart's message says what restarts ("restarting in place", "restarting the gang").
    restarting: ClassVar[str] = "the gang"
    # Whether a restart creates every pod anew, so status.recreatedAttempt moves to its attempt.
    restart_recreates: ClassVar[bool] = True

    @abstractmethod
    def replaced_by_restart(self, pods: GangPods, *, running: tuple[str, ...],
                            anyway: tuple[str, ...]) -> tuple[str, ...]:
        """The pods a restart deletes: of `pods`, with `running` (the gang's pods and any waiting apart)
        and `anyway` (older ones, deleted whatever else happens)."""

    def regrouping(self, status: JobStatus) -> bool:
        """Whether a restarted gang whose pods stayed ready is still to form again, and so not Running."""
        return False

    def left_out_of_window(self, deleting: Collection[str]) -> frozenset[str]:
        """Of the uids of pods whose delete was issued, those the attempt's window leaves out whatever
        their label. A gang of its own attempt's pods only needs none: a restart's pods have a new label."""
        return frozenset()

    def members(self, status: JobStatus) -> tuple[int, ...] | None:
        """The attempt's gang, pod indices in rank order; None: every pod of the job."""
        return None

    def restart_members(self, pods: GangPods, waiting: elastic.WaitingPods) -> tuple[int, ...] | None:
        """The gang of the attempt a failure starts; None: the gang stays every pod of the job."""
        return None

    def resize(self, *, status: JobStatus, pods: GangPods, waiting: elastic.WaitingPods,
               now: datetime) -> elastic.Resize | None:
        """A shrink or a grow the gang is due; None: the gang keeps its size."""
        return None

    def deadline_left(self, *, status: JobStatus, pods: GangPods, kept: inplace.KeptPods,
                      now: datetime) -> float | None:
        """Seconds left for a restart's kept gang to form; None: no such restart is waiting."""
        return None

    def exit_grace_left(self, status: JobStatus, now: datetime) -> float | None:
        """Seconds a failed job still leaves the pod of a rank process that failed in place to end by
        itself; None: nothing to wait for."""
        return None

    @property
    def least_created(self) -> int | None:
        """The fewest of a gang's pods creation may make without the rest (those a quota cannot hold
        are left out); None: the whole gang or none of it."""
        return None

    def part_may_start(self, pods: int) -> bool:
        """Whether `pods` of the gang, the rest refused, may start without them."""
        least = self.least_created
        return least is not None and pods >= least

    def membership_status(self, members: Sequence[int],
                          checkpoint_wanted: elastic.CheckpointRequest | None) -> StatusPatch:
        """The status fields the mode keeps of the gang's members (`members`: the attempt's gang) and of
        a grow waiting for a checkpoint; none for a mode without members."""
        return {}


@dataclass(frozen=True)
class Recreate(Mode):
    """restartStrategy Recreate (recreate.py)."""

    def replaced_by_restart(self, pods: GangPods, *, running: tuple[str, ...],
                            anyway: tuple[str, ...]) -> tuple[str, ...]:
        return recreate.replaced_by_restart(pods, running, anyway)


@dataclass(frozen=True)
class InPlace(Mode):
    """restartStrategy InPlace (inplace.py)."""

    restarting: ClassVar[str] = "in place"
    restart_recreates: ClassVar[bool] = False

    def replaced_by_restart(self, pods: GangPods, *, running: tuple[str, ...],
                            anyway: tuple[str, ...]) -> tuple[str, ...]:
        return inplace.replaced_by_restart(pods, anyway)

    def regrouping(self, status: JobStatus) -> bool:
        # The kept pods stay ready throughout: the gang runs again once rank 0 says it formed.
        return status.phase == c.PHASE_RESTARTING and not status.gang_formed

    def left_out_of_window(self, deleting: Collection[str]) -> frozenset[str]:
        # The window spans attempts, and a replaced pod keeps a label in it until the watch shows it going.
        return frozenset(deleting)

    def deadline_left(self, *, status: JobStatus, pods: GangPods, kept: inplace.KeptPods,
                      now: datetime) -> float | None:
        return inplace.deadline_left(self.spec, status=status, pods=pods, kept=kept, now=now)

    def exit_grace_left(self, status: JobStatus, now: datetime) -> float | None:
        return inplace.exit_grace_left(status, now)


@dataclass(frozen=True)
class Elastic(InPlace):
    """spec.minWorldSize below worldSize, on InPlace restarts (elastic.py)."""

    def members(self, status: JobStatus) -> tuple[int, ...] | None:
        return elastic.members(self.spec, status)

    def restart_members(self, pods: GangPods, waiting: elastic.WaitingPods) -> tuple[int, ...] | None:
        return elastic.restart_members(self.spec, pods, waiting)

    def resize(self, *, status: JobStatus, pods: GangPods, waiting: elastic.WaitingPods,
               now: datetime) -> elastic.Resize | None:
        return elastic.resize(self.spec, status=status, pods=pods, waiting=waiting, now=now)

    @property
    def least_created(self) -> int | None:
        # An elastic gang starts without the pods that do not fit, down to its minimum.
        return self.spec.min_pods

    def membership_status(self, members: Sequence[int],
                          checkpoint_wanted: elastic.CheckpointRequest | None) -> StatusPatch:
        return {STATUS_MEMBERS: list(members),
                STATUS_CHECKPOINT_REQUESTED: checkpoint_wanted.as_status() if checkpoint_wanted is not None else None}


@dataclass(frozen=True)
class Spared(InPlace):
    """spec.sparePods on InPlace restarts, at a fixed size (spares.py)."""

    def members(self, status: JobStatus) -> tuple[int, ...] | None:
        return spares.members(self.spec, status.members)

    def restart_members(self, pods: GangPods, waiting: elastic.WaitingPods) -> tuple[int, ...] | None:
        return spares.restart_members(self.spec, pods, waiting.running)

    def membership_status(self, members: Sequence[int],
                          checkpoint_wanted: elastic.CheckpointRequest | None) -> StatusPatch:
        return {STATUS_MEMBERS: list(members)}


def of(spec: JobSpec) -> Mode:
    """The job's restart mode: the one place that reads which it is from the spec."""
    if spec.elastic:
        return Elastic(spec)
    if spec.spare_pods:
        return Spared(spec)
    return InPlace(spec) if spec.in_place else Recreate(spec)
