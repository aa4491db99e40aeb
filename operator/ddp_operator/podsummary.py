"""A job's pods, seen from its current gang attempt: the generic reading (gangpods.py) and what the
job's restart modes add to it (modes/inplace.py: the pods kept across attempts and the rank processes
that failed in them; modes/elastic.py: the pods waiting apart from an elastic job's gang)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from ddp_operator.failures import PodProblem
from ddp_operator.gangpods import AttemptWindow, GangPods, in_gang, summarize_gang
from ddp_operator.modes import elastic, inplace, recreate
from ddp_operator.podstate import PodView


@dataclass(frozen=True)
class PodSummary(GangPods):
    """GangPods, with what the restart modes read of the same pods."""

    kept: inplace.KeptPods = inplace.KeptPods()
    waiting: elastic.WaitingPods = elastic.WaitingPods()
    # pod name -> the node the operator last saw it bound to (JobMemory): where a pod that vanished ran
    nodes_seen: Mapping[str, str] = field(default_factory=dict)
    # seconds until a pod waiting on a scheduler of its own that has not answered is said to be held up
    scheduler_due: float | None = None

    @property
    def running_pods(self) -> tuple[str, ...]:
        """Pods whose trainer still runs or waits to: the gang's, and an elastic job's waiting pods."""
        return self.active_pods + self.waiting.names

    @property
    def replaced_anyway(self) -> tuple[str, ...]:
        """Pods deleted whatever else happens: older attempts', and an elastic job's waiting pods that
        ended or are on a lost node (created again, to wait on)."""
        return self.stale_pods + self.waiting.ended

    def every_pod(self) -> tuple[str, ...]:
        """Every pod not already being deleted."""
        return recreate.every_pod(self, self.running_pods, self.replaced_anyway)

    def with_problems(self, found: Iterable[PodProblem]) -> PodSummary:
        """This summary with more pods held up; a pod's new problem replaces what was said of it. Of an
        elastic job, those of pods outside the gang are the waiting pods' problems."""
        found = tuple(found)
        if not found:
            return self
        indices = {p.index for p in found}
        kept = tuple(p for p in self.problems if p.index not in indices)
        apart = tuple(p for p in found if self.gang and p.index not in self.gang)
        waiting = self.waiting.without(indices)
        return replace(self, problems=tuple(sorted(kept + tuple(p for p in found if p not in apart), key=lambda p: p.index)),
                       waiting=replace(waiting, problems=tuple(sorted(waiting.problems + apart, key=lambda p: p.index))))


def summarize_pods(pods: Iterable[Mapping[str, Any]], attempt: int, *, job_name: str = "",
                   lost_nodes: Mapping[str, str] | None = None, ranks_per_pod: int = 1,
                   since: int | None = None, replaced: Collection[str] = (),
                   process_failures: Mapping[str, Any] | None = None,
                   members: Sequence[int] | None = None) -> PodSummary:
    """Counts and the earliest failure for `attempt`; job_name (else the pods' label) names lost pods.

    since, replaced (restartStrategy InPlace): the gang is the pods labelled from attempt `since`
    (status.recreatedAttempt; default `attempt`) up to `attempt`, less `replaced`, the uids of pods whose
    delete was issued, old whatever their label until the pod watch shows them going. process_failures
    (status.processFailures): rank processes of this attempt that failed while their pod goes on, as
    their runtime reported them.

    members (elastic jobs, status.members): the attempt's gang; the job's other current pods wait apart
    (PodSummary.waiting) and are never a failure of the gang.

    lost_nodes (node -> why, from nodes.lost_nodes): a pod of the gang still pending or running on one
    is a failure (NodeLost), and any pod being deleted there is to be force-deleted.
    """
    lost_nodes = lost_nodes or {}
    views = [PodView.of(pod) for pod in pods]
    window = AttemptWindow.of(attempt, since, replaced)
    current: list[PodView] = []
    outside: list[PodView] = []
    for view in views:
        (current if window.holds(view) else outside).append(view)
    gang_pods = in_gang(current, members)
    live = [p for p in gang_pods if not p.deleting]
    gang = summarize_gang(views, outside, gang_pods, window, job_name=job_name, lost_nodes=lost_nodes,
                          ranks_per_pod=ranks_per_pod, members=members,
                          more_failures=inplace.process_failures(live, process_failures, attempt))
    waiting = elastic.waiting_pods(current, members, lost_nodes) if members is not None else elastic.WaitingPods()
    return PodSummary(**{f.name: getattr(gang, f.name) for f in fields(gang)},
                      kept=inplace.kept_pods(live, attempt), waiting=waiting)
