"""The pods of a job's current gang attempt, whatever its restart mode: counts, the earliest failure,
what holds its pods up, which pods are old or on a lost node. The restart modes' rooms (modes/) read
what each adds from the same pods; podsummary.py puts the readings together.

Pods of older attempts and pods being deleted still hold their names ('<job>-<index>'), so a pod is
created again only once its name is free.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

from ddp_operator.failures import PodProblem, RankFailure, describe_problems
from ddp_operator.podstate import PodView, node_lost, rank_failure, rank_problem


@dataclass(frozen=True)
class AttemptWindow:
    """Which pods belong to the current attempt: labelled from attempt `since` up to `attempt`
    (restartStrategy InPlace keeps pods across attempts; else `since` is `attempt`), and not among
    `replaced`, the uids of pods whose delete was issued, old whatever their label."""

    attempt: int
    since: int
    replaced: frozenset[str] = frozenset()

    @classmethod
    def of(cls, attempt: int, since: int | None = None, replaced: Collection[str] = ()) -> AttemptWindow:
        return cls(attempt, attempt if since is None else min(since, attempt), frozenset(replaced))

    def holds(self, pod: PodView) -> bool:
        return (pod.index is not None and pod.attempt is not None and self.since <= pod.attempt <= self.attempt
                and pod.uid not in self.replaced)


@dataclass(frozen=True)
class GangPods:
    """The pods of one job, seen from its current gang attempt.

    Counts cover the gang's current pods that are not being deleted. `taken_indices` holds the index
    of every pod that exists (any attempt, deleting or not): its name '<job>-<index>' is taken, so that
    pod is created only once it is gone. A "rank" here is a pod's index, the rank only when
    ranks_per_pod is 1.
    """

    attempt: int
    job_name: str = ""
    pending: int = 0
    running: int = 0
    ready: int = 0
    succeeded: int = 0
    failed: int = 0
    live_indices: frozenset[int] = frozenset()  # the gang's current pods, not being deleted
    active_pods: tuple[str, ...] = ()  # of those, the ones whose trainer has not finished
    finished_pods: tuple[str, ...] = ()  # of those, the ones whose trainer finished
    leaving_indices: frozenset[int] = frozenset()  # of live_indices, those a restart replaces: finished, on a lost node
    stale_pods: tuple[str, ...] = ()  # other attempts (or unlabelled), not yet being deleted
    taken_indices: frozenset[int] = frozenset()
    failure: RankFailure | None = None  # the earliest failed rank of the current attempt
    problems: tuple[PodProblem, ...] = ()  # pods held up, by index
    uids: Mapping[str, str] = field(default_factory=dict)  # pod name -> uid, for deletes that miss a newer pod
    nodes: frozenset[str] = frozenset()  # the nodes the pods are bound to
    unscheduled_indices: frozenset[int] = frozenset()  # current, pending, bound to no node yet
    lost_pods: tuple[str, ...] = ()  # being deleted on a lost node, where no kubelet will ever finish it
    on_lost_nodes: tuple[str, ...] = ()  # current, pending or running on a lost node
    ranks_per_pod: int = 1
    # The attempt's gang: pod indices in rank order, () when every pod is in it (an elastic job's
    # members; its other pods wait apart, modes/elastic.py). Every count and failure above is the gang's.
    gang: tuple[int, ...] = ()

    @property
    def total(self) -> int:
        return len(self.live_indices)

    def gang_pods(self, pods: int) -> int:
        """How many pods the attempt's gang has, of the job's `pods`."""
        return len(self.gang) or pods

    @cached_property
    def held_up(self) -> tuple[str, str]:
        """describe_problems(problems): the commonest cause and the pods grouped by cause; ("", "") if none."""
        return describe_problems(self.problems, "rank" if self.ranks_per_pod == 1 else "pod")


def in_gang(current: Iterable[PodView], members: Collection[int] | None) -> list[PodView]:
    """The gang's pods of `current` (the pods the attempt window holds), those being deleted included."""
    if members is None:
        return list(current)
    wanted = frozenset(members)
    return [p for p in current if p.index in wanted]


def summarize_gang(pods: Sequence[PodView], outside: Iterable[PodView], gang: Sequence[PodView],
                   window: AttemptWindow, *, job_name: str, lost_nodes: Mapping[str, str], ranks_per_pod: int,
                   members: Sequence[int] | None, more_failures: Iterable[RankFailure] = ()) -> GangPods:
    """What the pods say of the gang (`outside`: those of `pods` the window does not hold; `gang`:
    in_gang of the others); more_failures: those a restart mode reads besides the pods' own."""
    live = [p for p in gang if not p.deleting]
    states = Counter(p.state for p in live)
    lost = [p for p in gang if p.node in lost_nodes and p.active]
    failures = [*(replace(node_lost(p.pod, _index(p), lost_nodes[p.node]), attempt=window.attempt) for p in lost),
                *(replace(rank_failure(p.pod, _index(p)), attempt=window.attempt) for p in live if p.state == "failed"),
                *more_failures]
    # The cause, not its echo: a rank whose collective broke because a peer died is reported only
    # when no peer failed for a reason of its own (finishedAt has 1 s resolution: ties are common).
    failures.sort(key=lambda f: (f.is_echo, f.finished_at or "", f.pod_index))
    problems = [found for p in live if p.state == "pending" and (found := rank_problem(p.pod, _index(p)))]
    return GangPods(
        attempt=window.attempt,
        job_name=job_name or next((p.job for p in pods if p.job), ""),
        pending=states["pending"], running=states["running"], succeeded=states["succeeded"], failed=states["failed"],
        ready=sum(1 for p in live if p.state == "running" and p.ready),
        live_indices=frozenset(_index(p) for p in live),
        active_pods=tuple(sorted(p.name for p in live if p.active)),
        finished_pods=tuple(sorted(p.name for p in live if not p.active)),
        leaving_indices=frozenset(_index(p) for p in live if not p.active or p.node in lost_nodes),
        stale_pods=tuple(sorted(p.name for p in outside if not p.deleting)),
        taken_indices=frozenset(p.index for p in pods if p.index is not None),
        failure=replace(failures[0], ranks_per_pod=ranks_per_pod) if failures else None,
        problems=tuple(sorted(problems, key=lambda p: p.index)),
        uids={p.name: p.uid for p in pods},
        nodes=frozenset(p.node for p in pods if p.node),
        unscheduled_indices=frozenset(_index(p) for p in live if p.state == "pending" and not p.node),
        lost_pods=tuple(sorted(p.name for p in pods if p.deleting and p.node in lost_nodes)),
        on_lost_nodes=tuple(sorted(p.name for p in lost)),
        ranks_per_pod=ranks_per_pod,
        gang=tuple(members) if members is not None else (),
    )


def _index(pod: PodView) -> int:
    assert pod.index is not None, "a pod of the window has an index"
    return pod.index
