"""Spare pods (spec.sparePods, restartStrategy InPlace): warm pods beyond the gang's that take a lost
pod's place.

The job keeps spec.all_pods pods ('<job>-0' .. '<job>-<all_pods-1>'); status.members names the
spec.pods of them in the attempt's gang, in rank order ('<job>-0' .. '<job>-<pods-1>' at first), and
the others wait apart (the elastic room's WaitingPods), their runtime's zygote holding torch imported.
A restart whose gang loses a pod (deleted, evicted, its trainer ended, on a lost node) gives that pod's
place, its ranks and so its share of the data, to a running spare, lowest index first; the lost pod is
created again and waits as the next spare. Where no spare runs, the place stays the lost pod's, created
again, as under InPlace alone. A rank process that fails in a pod that goes on keeps its place: the pod
starts it again.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from ddp_contract.jobspec import JobSpec
from ddp_operator.gangpods import GangPods
from ddp_operator.manifests import pod_name


def members(spec: JobSpec, recorded: Sequence[int] | None) -> tuple[int, ...]:
    """The attempt's gang in rank order: status.members where it names spec.pods distinct pods of the
    job, else the first spec.pods."""
    if (recorded is not None and len(recorded) == spec.pods and len(set(recorded)) == len(recorded)
            and all(0 <= i < spec.all_pods for i in recorded)):
        return tuple(recorded)
    return tuple(range(spec.pods))


def restart_members(spec: JobSpec, pods: GangPods, spares_running: Collection[int]) -> tuple[int, ...]:
    """The gang of the attempt a failure starts: each member that goes on keeps its place; a member the
    restart loses gives its place to a running spare (lowest index first), or keeps it where none runs."""
    gang = pods.gang or tuple(range(spec.pods))
    staying = pods.live_indices - pods.leaving_indices
    free = iter(sorted(set(spares_running) - set(gang)))
    return tuple(i if i in staying else next(free, i) for i in gang)


def takeovers(spec: JobSpec, job_name: str, before: Sequence[int], after: Sequence[int]) -> str:
    """How a restart's message says which spares took which places ('' where none did, or where the gang
    changed size: an elastic resize)."""
    if len(before) != len(after):
        return ""
    return "; ".join(f"spare {pod_name(job_name, new)} takes the place of {pod_name(job_name, old)} "
                     f"({_ranks(spec, place)})"
                     for place, (old, new) in enumerate(zip(before, after, strict=True)) if old != new)


def _ranks(spec: JobSpec, place: int) -> str:
    held = spec.pod_ranks(place)
    return f"rank {held[0]}" if len(held) == 1 else f"ranks {held[0]}-{held[-1]}"
