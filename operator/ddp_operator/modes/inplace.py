"""restartStrategy InPlace: a restart replaces only the pods that cannot go on; in every other pod the
runtime starts its rank processes again for the next attempt. So the gang is the pods labelled from
status.recreatedAttempt up to the current attempt (gangpods.AttemptWindow), a rank process can fail
while its pod runs on (status.processFailures, reported by its runtime), and a kept gang that does not
form again within inPlaceDeadlineSeconds is recreated."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ddp_contract.jobspec import JobSpec
from ddp_contract.resource import JobStatus
from ddp_contract.timestamps import parse_rfc3339
from ddp_operator import constants as c
from ddp_operator.failures import RankFailure, last_lines
from ddp_operator.gangpods import GangPods
from ddp_operator.podstate import PodView, exit_reason

# How long a failed job waits for the pod of a rank process that failed in place to end by itself.
EXIT_GRACE_SECONDS = 30.0


@dataclass(frozen=True)
class KeptPods:
    """What InPlace reads of the gang's live pods."""

    carried: tuple[str, ...] = ()  # created for an earlier attempt, in this one's gang
    last_started: str | None = None  # the latest start of a running trainer container


def kept_pods(live: Iterable[PodView], attempt: int) -> KeptPods:
    live = list(live)
    starts = [p.started for p in live if p.state == "running" and p.started]
    return KeptPods(carried=tuple(sorted(p.name for p in live if p.attempt is not None and p.attempt < attempt)),
                    last_started=max(starts) if starts else None)


def process_failures(live: Iterable[PodView], reported: Mapping[str, Any] | None, attempt: int) -> list[RankFailure]:
    """The failures the runtimes of running pods reported for `attempt` (status.processFailures)."""
    reported = reported or {}
    return [failure for p in live if p.state == "running" and p.index is not None
            and (failure := process_failure(p.pod, p.index, reported.get(str(p.index)), attempt))]


def process_failure(pod: Mapping[str, Any], index: int, report: Mapping[str, Any] | None,
                    attempt: int) -> RankFailure | None:
    """The failure the runtime of the running pod of index `index` reported for `attempt`
    (status.processFailures[str(index)]), read as the same exit of a container would be; None when it
    reported none for this attempt."""
    if not report or report.get("attempt") != attempt or not isinstance(report.get("exitCode"), int):
        return None
    exit_code = int(report["exitCode"])
    return RankFailure(
        pod_index=index,
        pod=(pod.get("metadata") or {}).get("name", ""),
        exit_code=exit_code,
        reason=exit_reason(str(report.get("reason") or "Error"), exit_code),
        evicted=False,
        finished_at=report.get("finishedAt"),
        node=(pod.get("spec") or {}).get("nodeName"),
        output=last_lines(report.get("message")),
        attempt=attempt,
        in_place=True,
    )


def replaced_by_restart(pods: GangPods, anyway: tuple[str, ...]) -> tuple[str, ...]:
    """The pods a restart replaces: those whose trainer container ended (failed, succeeded or
    evicted), those on a lost node, and `anyway` (older ones)."""
    return tuple(sorted(set(pods.finished_pods + pods.on_lost_nodes + anyway)))


def deadline_left(spec: JobSpec, *, status: JobStatus, pods: GangPods, kept: KeptPods,
                  now: datetime) -> float | None:
    """Seconds left for a restart's gang to form, counted from when the restart was decided
    (status.attemptTime, else the Restarting condition's time) or, later, the last of its pods started
    running; None when no such restart is waiting on pods it kept."""
    if status.phase != c.PHASE_RESTARTING or status.gang_formed:
        return None
    if not kept.carried or pods.running < pods.gang_pods(spec.pods):
        return None  # a rank still pending is held up for its own reasons, reported as such
    restarted = status.condition(c.COND_RESTARTING) or {}
    since = [t for t in (parse_rfc3339(restarted.get("lastTransitionTime")), parse_rfc3339(kept.last_started),
                         parse_rfc3339(status.attempt_time)) if t is not None]
    if not since:
        return None
    return spec.in_place_deadline_seconds - (now - max(since)).total_seconds()


def overdue(spec: JobSpec, pods: GangPods, kept: KeptPods) -> tuple[str, str, tuple[str, ...]]:
    """(reason, message, pods to delete) when a restart's gang did not form within inPlaceDeadlineSeconds
    of all its pods running (a rank process that cannot be stopped, a runtime that never starts its
    rank again): the pods kept from earlier attempts are recreated, for the same attempt, on no budget."""
    message = (f"the gang of attempt {pods.attempt} did not form within inPlaceDeadlineSeconds="
               f"{spec.in_place_deadline_seconds} of all its pods running; recreating the pods kept from earlier "
               f"attempts: {', '.join(kept.carried)}")
    return c.REASON_IN_PLACE_TIMED_OUT, message, kept.carried


def exit_grace_left(status: JobStatus, now: datetime) -> float | None:
    """Seconds the pod of a rank process that failed in place still has to end on its own after the
    job failed; None once past it, or when there is no such pod to wait for."""
    completed = parse_rfc3339(status.completion_time)
    if completed is None or status.phase != c.PHASE_FAILED:
        return None
    left = EXIT_GRACE_SECONDS - (now - completed).total_seconds()
    return left if left > 0 else None
