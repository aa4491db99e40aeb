"""A job's pods, seen from its current gang attempt: counts, the earliest failure, what is in the way.

Pods of older attempts and pods being deleted still hold their names ('<job>-<rank>'), so a rank is
created again only once its name is free.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from ddp_contract import labels
from ddp_contract.exitcodes import ExitCode, is_infrastructure_exit
from ddp_contract.failures import FailureLine, parse_line
from ddp_operator import constants as c

# How much of a failed rank's output its status and Event keep.
OUTPUT_LINES = 20
OUTPUT_CHARS = 2000


@dataclass(frozen=True)
class RankFailure:
    rank: int
    pod: str
    exit_code: int | None
    reason: str
    evicted: bool  # the node or the scheduler took the pod away, not the training code
    finished_at: str | None = None
    node: str | None = None
    output: str | None = None  # the container's termination message: its last lines
    attempt: int | None = None
    ranks_per_pod: int = 1  # `rank` is the pod's index when its pod holds several

    @cached_property
    def line(self) -> FailureLine | None:
        """The runtime's failure line in the output (step, error), when the rank ran the runtime."""
        return parse_line(self.output)

    @property
    def echo_grace_s(self) -> float | None:
        """For a failure most often caused by another rank, how long to wait for that rank's own: a
        collective that broke (COMMUNICATION_ERROR), or rank 0's rendezvous timing out
        (RENDEZVOUS_FAILED: rank 0 holds the store the others join, so it times out because one of
        them could not join, and that rank is the one to name). None: not an echo."""
        if self.exit_code == ExitCode.COMMUNICATION_ERROR:
            return c.ECHO_GRACE_SECONDS
        if self.exit_code == ExitCode.RENDEZVOUS_FAILED and self.rank == 0:
            return c.RENDEZVOUS_ECHO_GRACE_SECONDS
        return None

    @property
    def is_echo(self) -> bool:
        return self.echo_grace_s is not None

    @property
    def kind(self) -> str:
        """Infrastructure (evicted, preempted, node lost, hung, killed from outside, the network or
        storage failed) or Program (the code's own error, an OOM kill): they draw on separate budgets."""
        if self.evicted or self.exit_code is None or is_infrastructure_exit(self.exit_code, self.oom_killed):
            return c.KIND_INFRASTRUCTURE
        return c.KIND_PROGRAM

    @property
    def signal(self) -> str | None:
        """SIGKILL for exit code 137 and the like: a process killed by signal N exits 128+N."""
        if self.exit_code is None or not 128 < self.exit_code < 128 + signal.NSIG:
            return None
        try:
            return signal.Signals(self.exit_code - 128).name
        except ValueError:
            return None

    @property
    def oom_killed(self) -> bool:
        return self.reason == "OOMKilled"

    @property
    def global_rank(self) -> int:
        """The rank that failed: the pod's, or in a pod of several the one whose failure line it is
        (else the pod's first)."""
        if self.ranks_per_pod == 1:
            return self.rank
        return self.line.rank if self.line and self.line.rank is not None else self.rank * self.ranks_per_pod

    @property
    def who(self) -> str:
        if self.ranks_per_pod > 1 and not (self.line and self.line.rank is not None):
            return rank_list(range(self.rank * self.ranks_per_pod, (self.rank + 1) * self.ranks_per_pod))
        return f"rank {self.global_rank}"

    def describe(self) -> str:
        where = f"{self.who} (pod {self.pod}{f' on node {self.node}' if self.node else ''})"
        if self.exit_code is not None:
            killed = f", {self.signal}" if self.signal else ""
            said = ""
            if self.line is not None:
                said = f" at step {self.line.step}" if self.line.step is not None else " before its first step"
                said += f": {self.line.error}"
            return f"{where} exited with code {self.exit_code} ({self.reason}{killed}){said}"
        if self.evicted:
            return f"{where} was lost: {self.reason}" + (f" ({self.output})" if self.output else "")
        return f"{where} failed: {self.reason}"

    def as_status(self) -> dict[str, Any]:
        """The status.failedRank object."""
        return {"rank": self.global_rank, "pod": self.pod, "node": self.node, "exitCode": self.exit_code,
                "signal": self.signal, "oomKilled": self.oom_killed, "reason": self.reason,
                "message": self.output, "kind": self.kind, "attempt": self.attempt,
                "step": self.line.step if self.line else None}


@dataclass(frozen=True)
class RankProblem:
    """Why a rank of the current attempt is not running: a machine-readable reason and the words of
    whoever said so (the scheduler, the kubelet)."""

    rank: int
    reason: str
    message: str = ""


@dataclass(frozen=True)
class PodSummary:
    """The pods of one job, seen from its current gang attempt.

    Counts cover only current-attempt pods that are not being deleted. `occupied_ranks` holds the
    rank of every pod that exists (any attempt, deleting or not): its name '<job>-<rank>' is taken,
    so that rank is created only once the pod is gone.
    """

    attempt: int
    job_name: str = ""
    pending: int = 0
    running: int = 0
    ready: int = 0
    succeeded: int = 0
    failed: int = 0
    live_ranks: frozenset[int] = frozenset()  # current attempt, not being deleted
    active_pods: tuple[str, ...] = ()  # current attempt, trainer not finished, not being deleted
    finished_pods: tuple[str, ...] = ()  # current attempt, trainer finished, not being deleted
    stale_pods: tuple[str, ...] = ()  # other attempts (or unlabelled), not yet being deleted
    occupied_ranks: frozenset[int] = frozenset()
    failure: RankFailure | None = None  # the earliest failed rank of the current attempt
    problems: tuple[RankProblem, ...] = ()  # ranks held up, by rank
    uids: Mapping[str, str] = field(default_factory=dict)  # pod name -> uid, for deletes that miss a newer pod
    nodes: frozenset[str] = frozenset()  # the nodes the pods are bound to
    unscheduled_ranks: frozenset[int] = frozenset()  # current attempt, pending, bound to no node yet
    lost_pods: tuple[str, ...] = ()  # being deleted on a lost node, where no kubelet will ever finish it
    ranks_per_pod: int = 1  # the job's ranksPerPod: a "rank" above is a pod's index when > 1

    @property
    def total(self) -> int:
        return len(self.live_ranks)

    @cached_property
    def held_up(self) -> tuple[str, str]:
        """describe_problems(problems): the commonest cause and the ranks grouped by cause; ("", "") if none."""
        return describe_problems(self.problems, "rank" if self.ranks_per_pod == 1 else "pod")

    def with_problems(self, found: Iterable[RankProblem]) -> PodSummary:
        """This summary with more ranks held up; a rank's new problem replaces what was said of it."""
        found = tuple(found)
        if not found:
            return self
        ranks = {p.rank for p in found}
        kept = tuple(p for p in self.problems if p.rank not in ranks)
        return replace(self, problems=tuple(sorted(kept + found, key=lambda p: p.rank)))


def summarize_pods(pods: Iterable[Mapping[str, Any]], attempt: int, job_name: str = "",
                   lost_nodes: Mapping[str, str] | None = None, ranks_per_pod: int = 1) -> PodSummary:
    """Counts and the earliest failure for `attempt`; job_name (else the pods' label) names lost ranks' pods.

    lost_nodes (node -> why, from nodes.lost_nodes): a rank of this attempt still pending or running
    on one is a failure (NodeLost), and any pod being deleted there is to be force-deleted.
    """
    lost_nodes = lost_nodes or {}
    counts = {"pending": 0, "running": 0, "ready": 0, "succeeded": 0, "failed": 0}
    live: set[int] = set()
    active: list[str] = []
    finished: list[str] = []
    stale: list[str] = []
    occupied: set[int] = set()
    failures: list[RankFailure] = []
    problems: list[RankProblem] = []
    uids: dict[str, str] = {}
    nodes: set[str] = set()
    unscheduled: set[int] = set()
    lost: list[str] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        name = meta.get("name", "")
        uids[name] = meta.get("uid", "")
        job_name = job_name or (meta.get("labels") or {}).get(labels.LABEL_JOB_NAME, "")
        rank = _label_int(meta, labels.LABEL_RANK)
        node: str = (pod.get("spec") or {}).get("nodeName") or ""
        if node:
            nodes.add(node)
        if rank is not None:
            occupied.add(rank)
        current = rank is not None and _label_int(meta, labels.LABEL_ATTEMPT) == attempt
        state = pod_state(pod)
        if node in lost_nodes:
            if meta.get("deletionTimestamp"):
                lost.append(name)
            if current and rank is not None and state in ("pending", "running"):
                failures.append(node_lost(pod, rank, lost_nodes[node]))
        if meta.get("deletionTimestamp"):
            continue
        if rank is None or not current:
            stale.append(name)
            continue
        live.add(rank)
        if state == "pending" and not node:
            unscheduled.add(rank)
        counts[state] += 1
        (active if state in ("pending", "running") else finished).append(name)
        if state == "running" and is_ready(pod):
            counts["ready"] += 1
        if state == "failed":
            failures.append(rank_failure(pod, rank))
        problem = rank_problem(pod, rank) if state == "pending" else None
        if problem:
            problems.append(problem)
    # The cause, not its echo: a rank whose collective broke because a peer died is reported only
    # when no peer failed for a reason of its own (finishedAt has 1 s resolution: ties are common).
    failures.sort(key=lambda f: (f.is_echo, f.finished_at or "", f.rank))
    return PodSummary(
        attempt=attempt,
        job_name=job_name,
        live_ranks=frozenset(live),
        active_pods=tuple(sorted(active)),
        finished_pods=tuple(sorted(finished)),
        stale_pods=tuple(sorted(stale)),
        occupied_ranks=frozenset(occupied),
        failure=replace(failures[0], ranks_per_pod=ranks_per_pod) if failures else None,
        problems=tuple(sorted(problems, key=lambda p: p.rank)),
        ranks_per_pod=ranks_per_pod,
        uids=uids,
        nodes=frozenset(nodes),
        unscheduled_ranks=frozenset(unscheduled),
        lost_pods=tuple(sorted(lost)),
        **counts,
    )


def pod_state(pod: Mapping[str, Any]) -> str:
    """pending | running | succeeded | failed, judged by the trainer container first.

    The trainer's own exit decides, so a sidecar that keeps a pod Running does not hide a finished rank.
    """
    status = pod.get("status") or {}
    terminated = (trainer_status(pod).get("state") or {}).get("terminated")
    if terminated is not None:
        return "succeeded" if terminated.get("exitCode") == 0 else "failed"
    phase = status.get("phase", "Pending")
    return {"Running": "running", "Succeeded": "succeeded", "Failed": "failed"}.get(phase, "pending")


def trainer_status(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    named = [s for s in statuses if s.get("name") == labels.CONTAINER_NAME]
    found: Mapping[str, Any] = (named or statuses or [{}])[0]
    return found


def is_ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(cond.get("type") == "Ready" and cond.get("status") == "True" for cond in conditions)


def is_eviction(pod: Mapping[str, Any]) -> bool:
    """Whether the pod was removed by the node or scheduler (evicted, preempted, node lost, ...)."""
    status = pod.get("status") or {}
    reason = status.get("reason") or ""
    if reason in c.EVICTION_REASONS or reason.startswith(c.EVICTION_REASON_PREFIX):
        return True
    return any(
        cond.get("type") == "DisruptionTarget" and cond.get("status") == "True"
        for cond in status.get("conditions") or []
    )


def rank_failure(pod: Mapping[str, Any], rank: int) -> RankFailure:
    terminated = (trainer_status(pod).get("state") or {}).get("terminated") or {}
    status = pod.get("status") or {}
    evicted = is_eviction(pod)
    exit_code = terminated.get("exitCode")
    if evicted:
        reason = status.get("reason") or _disruption_reason(status) or "Evicted"
    else:
        reason = terminated.get("reason") or status.get("reason") or "Failed"
        if reason == "Error" and exit_code in c.RUNTIME_EXIT_REASONS:
            reason = c.RUNTIME_EXIT_REASONS[exit_code]
    return RankFailure(
        rank=rank,
        pod=(pod.get("metadata") or {}).get("name", ""),
        exit_code=exit_code,
        reason=reason,
        evicted=evicted,
        finished_at=terminated.get("finishedAt"),
        node=(pod.get("spec") or {}).get("nodeName"),
        output=last_lines(terminated.get("message") or status.get("message")),
        attempt=_label_int(pod.get("metadata") or {}, labels.LABEL_ATTEMPT),
    )


def node_lost(pod: Mapping[str, Any], rank: int, why: str) -> RankFailure:
    """The failure of a rank whose node is lost: an infrastructure failure (evicted), whatever its
    pod's last reported state says."""
    meta = pod.get("metadata") or {}
    return RankFailure(rank=rank, pod=meta.get("name", ""), exit_code=None, reason=c.REASON_NODE_LOST, evicted=True,
                       node=(pod.get("spec") or {}).get("nodeName"), output=why,
                       attempt=_label_int(meta, labels.LABEL_ATTEMPT))


def last_lines(text: str | None, lines: int = OUTPUT_LINES, chars: int = OUTPUT_CHARS) -> str | None:
    """The end of a container's output, small enough for a status field and an Event."""
    if not text or not text.strip():
        return None
    tail = "\n".join(text.rstrip().splitlines()[-lines:])
    return tail if len(tail) <= chars else "..." + tail[-(chars - 3):]


def rank_problem(pod: Mapping[str, Any], rank: int) -> RankProblem | None:
    """Why a pending rank is held up, if anything says so: the scheduler (Unschedulable, with its
    message, e.g. "0/4 nodes are available: 4 Insufficient nvidia.com/gpu") or the kubelet (the
    trainer container waiting on an image pull, a missing Secret or ConfigMap, ...)."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("reason") == "Unschedulable":
            return RankProblem(rank, c.REASON_UNSCHEDULABLE, str(cond.get("message") or "").strip())
    waiting = (trainer_status(pod).get("state") or {}).get("waiting") or {}
    reason = str(waiting.get("reason") or "")
    if not reason or reason in c.WAITING_NORMALLY:
        return None
    message = str(waiting.get("message") or reason).strip()
    if reason in c.PULL_FAILED_REASONS:
        message += pull_secrets_note(pod)
    return RankProblem(rank, c.WAITING_REASONS.get(reason, reason), message)


def pull_secrets_note(pod: Mapping[str, Any]) -> str:
    """What a failed pull was tried with: the pod's imagePullSecrets. The kubelet pulls without one
    that does not exist, and says so only in an Event on the pod (FailedToRetrieveImagePullSecret),
    so the registry's refusal ("no basic auth credentials") alone would not point at it."""
    names = [str(item["name"]) for item in (pod.get("spec") or {}).get("imagePullSecrets") or [] if item.get("name")]
    if not names:
        return ""
    return (f" (imagePullSecrets: {', '.join(names)}; the kubelet pulls without any that does not exist, "
            "saying so in the pod's events)")


@dataclass(frozen=True)
class InTheWay:
    """Names the job needs that objects it does not control hold: job-wide ones ("Service mnist")
    and ranks' pods (rank -> pod name). The operator never adopts, changes or deletes them."""

    objects: tuple[str, ...] = ()
    pods: tuple[tuple[int, str], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.objects or self.pods)

    def problems(self, world_size: int, live_ranks: Iterable[int]) -> tuple[RankProblem, ...]:
        """The ranks they hold up: every rank not yet created for a job-wide one, the rank for a pod."""
        advice = "; the operator never adopts, changes or deletes it: delete it, or rename the job"
        found: list[RankProblem] = []
        if self.objects:
            held = ", ".join(self.objects)
            live = set(live_ranks)
            found += [RankProblem(r, c.REASON_NAME_IN_USE, f"{held} exists and is not this job's{advice}")
                      for r in range(world_size) if r not in live]
        found += [RankProblem(rank, c.REASON_NAME_IN_USE, f"pod {pod} exists and is not this job's{advice}")
                  for rank, pod in self.pods]
        return tuple(found)


def describe_problems(problems: Iterable[RankProblem], noun: str = "rank") -> tuple[str, str]:
    """(the reason most ranks share, a message naming the ranks, those with one cause and message together).

    "ranks 0-3, 6 (Unschedulable): 0/4 nodes are available: 4 Insufficient nvidia.com/gpu.; rank 5
    (ImagePullError): ..."
    """
    groups: dict[tuple[str, str], list[int]] = {}
    for problem in problems:
        groups.setdefault((problem.reason, problem.message), []).append(problem.rank)
    if not groups:
        return "", ""
    ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), item[1][0]))
    parts = [f"{rank_list(ranks, noun)} ({reason}): {message}" if message else f"{rank_list(ranks, noun)} ({reason})"
             for (reason, message), ranks in ordered]
    return ordered[0][0][0], "; ".join(parts)


def rank_list(ranks: Iterable[int], noun: str = "rank") -> str:
    """'rank 3', 'ranks 0-3, 6' (or 'pod 3', 'pods 0-1')."""
    ordered = sorted(set(ranks))
    spans: list[str] = []
    start = prev = ordered[0]
    for rank in [*ordered[1:], None]:
        if rank is not None and rank == prev + 1:
            prev = rank
            continue
        spans.append(str(start) if start == prev else f"{start}-{prev}")
        if rank is not None:
            start = prev = rank
    return f"{noun} {spans[0]}" if len(ordered) == 1 else f"{noun}s {', '.join(spans)}"


def _disruption_reason(status: Mapping[str, Any]) -> str | None:
    for cond in status.get("conditions") or []:
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            return str(cond.get("reason") or "") or None
    return None


def _label_int(meta: Mapping[str, Any], key: str) -> int | None:
    value = (meta.get("labels") or {}).get(key)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
