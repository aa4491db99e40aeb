"""A job's pods, seen from its current gang attempt: counts, the earliest failure, what is in the way.

Pods of older attempts and pods being deleted still hold their names ('<job>-<rank>'), so a rank is
created again only once its name is free.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from ddp_contract import labels
from ddp_operator import constants as c
from ddp_operator.failures import RankFailure, RankProblem, describe_problems, last_lines
from ddp_operator.kubelet import EVICTION_REASON_PREFIX, EVICTION_REASONS, PULL_FAILED_REASONS, WAITING_NORMALLY, WAITING_REASONS
from ddp_operator.podsecurity import root_image_problem


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
    on_lost_nodes: tuple[str, ...] = ()  # current attempt, pending or running on a lost node
    carried_pods: tuple[str, ...] = ()  # current attempt, created for an earlier one (restartStrategy InPlace)
    last_started: str | None = None  # the latest start of a running trainer container of the current attempt
    ranks_per_pod: int = 1  # the job's ranksPerPod: a "rank" above is a pod's index when > 1
    # Elastic jobs: the attempt's gang (pod indices in rank order; () when every pod is in it) and the
    # job's other current pods, which wait to be taken in. Every count and failure above is the gang's.
    gang: tuple[int, ...] = ()
    probes: tuple[str, ...] = ()  # pending or running, not being deleted
    running_probes: frozenset[int] = frozenset()  # their indices, where the trainer container runs
    pending_probes: frozenset[int] = frozenset()  # their indices, where it does not run yet
    dead_probes: tuple[str, ...] = ()  # finished, or on a lost node: to be replaced
    probe_problems: tuple[RankProblem, ...] = ()  # why the pending ones wait, or why one has no pod

    @property
    def total(self) -> int:
        return len(self.live_ranks)

    def gang_pods(self, pods: int) -> int:
        """How many pods the attempt's gang has, of the job's `pods`."""
        return len(self.gang) or pods

    @cached_property
    def held_up(self) -> tuple[str, str]:
        """describe_problems(problems): the commonest cause and the ranks grouped by cause; ("", "") if none."""
        return describe_problems(self.problems, "rank" if self.ranks_per_pod == 1 else "pod")

    def with_problems(self, found: Iterable[RankProblem]) -> PodSummary:
        """This summary with more ranks held up; a rank's new problem replaces what was said of it. Of an
        elastic job, those of pods outside the gang are probe_problems."""
        found = tuple(found)
        if not found:
            return self
        ranks = {p.rank for p in found}
        kept = tuple(p for p in self.problems if p.rank not in ranks)
        waiting = tuple(p for p in found if self.gang and p.rank not in self.gang)  # an elastic job's others
        probes = tuple(p for p in self.probe_problems if p.rank not in ranks) + waiting
        return replace(self, problems=tuple(sorted(kept + tuple(p for p in found if p not in waiting),
                                                   key=lambda p: p.rank)),
                       probe_problems=tuple(sorted(probes, key=lambda p: p.rank)))


def summarize_pods(pods: Iterable[Mapping[str, Any]], attempt: int, job_name: str = "",
                   lost_nodes: Mapping[str, str] | None = None, ranks_per_pod: int = 1, *,
                   since: int | None = None, replaced: Collection[str] = (),
                   process_failures: Mapping[str, Any] | None = None,
                   members: Sequence[int] | None = None) -> PodSummary:
    """Counts and the earliest failure for `attempt`; job_name (else the pods' label) names lost ranks' pods.

    The gang is the pods labelled from attempt `since` (status.recreatedAttempt; default `attempt`) up
    to `attempt`: restartStrategy InPlace keeps the pods that can go on across attempts. `replaced`:
    uids of pods whose delete was issued, which count as old whatever their label until the pod watch
    shows them going. process_failures (status.processFailures): rank processes of this attempt that
    failed while their pod goes on, as their runtime reported them.

    members (elastic jobs, status.members): the attempt's gang; the job's other current pods are
    probes, counted apart (PodSummary.probes ...) and never a failure of the gang.

    lost_nodes (node -> why, from nodes.lost_nodes): a rank of this attempt still pending or running
    on one is a failure (NodeLost), and any pod being deleted there is to be force-deleted.
    """
    lost_nodes = lost_nodes or {}
    since = attempt if since is None else min(since, attempt)
    reported = process_failures or {}
    counts = {"pending": 0, "running": 0, "ready": 0, "succeeded": 0, "failed": 0}
    live: set[int] = set()
    active: list[str] = []
    finished: list[str] = []
    stale: list[str] = []
    occupied: set[int] = set()
    failures: list[RankFailure] = []
    problems: list[RankProblem] = []
    uids: dict[str, str] = {}
    gang = frozenset(members) if members is not None else None
    probes: list[str] = []
    running_probes: set[int] = set()
    pending_probes: set[int] = set()
    dead_probes: list[str] = []
    probe_problems: list[RankProblem] = []
    nodes: set[str] = set()
    unscheduled: set[int] = set()
    lost: list[str] = []
    on_lost: list[str] = []
    carried: list[str] = []
    starts: list[str] = []
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
        label = _label_int(meta, labels.LABEL_ATTEMPT)
        current = rank is not None and label is not None and since <= label <= attempt \
            and meta.get("uid") not in replaced
        state = pod_state(pod)
        probe = current and gang is not None and rank not in gang
        if probe and rank is not None and not meta.get("deletionTimestamp"):
            if state in ("succeeded", "failed") or node in lost_nodes:
                dead_probes.append(name)
            else:
                probes.append(name)
                (running_probes if state == "running" else pending_probes).add(rank)
                if state != "running" and (problem := rank_problem(pod, rank)):
                    probe_problems.append(problem)
            continue
        if node in lost_nodes:
            if meta.get("deletionTimestamp"):
                lost.append(name)
            if current and rank is not None and not probe and state in ("pending", "running"):
                failures.append(replace(node_lost(pod, rank, lost_nodes[node]), attempt=attempt))
                on_lost.append(name)
        if meta.get("deletionTimestamp"):
            continue
        if rank is None or not current:
            stale.append(name)
            continue
        live.add(rank)
        if label is not None and label < attempt:
            carried.append(name)
        if state == "running" and (started := running_since(pod)):
            starts.append(started)
        if state == "pending" and not node:
            unscheduled.add(rank)
        counts[state] += 1
        (active if state in ("pending", "running") else finished).append(name)
        if state == "running" and is_ready(pod):
            counts["ready"] += 1
        if state == "failed":  # of this attempt, whichever it was created for
            failures.append(replace(rank_failure(pod, rank), attempt=attempt))
        elif state == "running" and (process := process_failure(pod, rank, reported.get(str(rank)), attempt)):
            failures.append(process)
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
        on_lost_nodes=tuple(sorted(on_lost)),
        carried_pods=tuple(sorted(carried)),
        last_started=max(starts) if starts else None,
        gang=tuple(members) if members is not None else (),
        probes=tuple(sorted(probes)),
        running_probes=frozenset(running_probes),
        pending_probes=frozenset(pending_probes),
        dead_probes=tuple(sorted(dead_probes)),
        probe_problems=tuple(sorted(probe_problems, key=lambda p: p.rank)),
        **counts,
    )


def running_since(pod: Mapping[str, Any]) -> str | None:
    """When the pod's trainer container started running (its state.running.startedAt), if it runs."""
    started = (trainer_status(pod).get("state") or {}).get("running", {}).get("startedAt")
    return str(started) if started else None


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


def trainer_status(pod: Mapping[str, Any], container: str = labels.CONTAINER_NAME) -> Mapping[str, Any]:
    """The status of the pod's `container` (the trainer), else of its first container."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    named = [s for s in statuses if s.get("name") == container]
    found: Mapping[str, Any] = (named or statuses or [{}])[0]
    return found


def is_ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(cond.get("type") == "Ready" and cond.get("status") == "True" for cond in conditions)


def is_eviction(pod: Mapping[str, Any]) -> bool:
    """Whether the pod was removed by the node or scheduler (evicted, preempted, node lost, ...)."""
    status = pod.get("status") or {}
    reason = status.get("reason") or ""
    if reason in EVICTION_REASONS or reason.startswith(EVICTION_REASON_PREFIX):
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
        reason = _exit_reason(terminated.get("reason") or status.get("reason") or "Failed", exit_code)
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


def process_failure(pod: Mapping[str, Any], rank: int, report: Mapping[str, Any] | None,
                    attempt: int) -> RankFailure | None:
    """The failure a running pod's runtime reported for `attempt` (status.processFailures[rank]), read
    as the same exit of a container would be; None when it reported none for this attempt."""
    if not report or report.get("attempt") != attempt or not isinstance(report.get("exitCode"), int):
        return None
    exit_code = int(report["exitCode"])
    reason = _exit_reason(str(report.get("reason") or "Error"), exit_code)
    return RankFailure(
        rank=rank,
        pod=(pod.get("metadata") or {}).get("name", ""),
        exit_code=exit_code,
        reason=reason,
        evicted=False,
        finished_at=report.get("finishedAt"),
        node=(pod.get("spec") or {}).get("nodeName"),
        output=last_lines(report.get("message")),
        attempt=attempt,
        in_place=True,
    )


def node_lost(pod: Mapping[str, Any], rank: int, why: str) -> RankFailure:
    """The failure of a rank whose node is lost: an infrastructure failure (evicted), whatever its
    pod's last reported state says."""
    meta = pod.get("metadata") or {}
    return RankFailure(rank=rank, pod=meta.get("name", ""), exit_code=None, reason=c.REASON_NODE_LOST, evicted=True,
                       node=(pod.get("spec") or {}).get("nodeName"), output=why,
                       attempt=_label_int(meta, labels.LABEL_ATTEMPT))


def rank_problem(pod: Mapping[str, Any], rank: int) -> RankProblem | None:
    """Why a pending rank is held up, if anything says so: the scheduler (Unschedulable, with its
    message, e.g. "0/4 nodes are available: 4 Insufficient nvidia.com/gpu") or the kubelet (the
    trainer container waiting on an image pull, a missing Secret or ConfigMap, ...)."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("reason") == "Unschedulable":
            return RankProblem(rank, c.REASON_UNSCHEDULABLE, str(cond.get("message") or "").strip())
    waiting = (trainer_status(pod).get("state") or {}).get("waiting") or {}
    reason = str(waiting.get("reason") or "")
    if not reason or reason in WAITING_NORMALLY:
        return None
    said = str(waiting.get("message") or reason).strip()
    as_root = root_image_problem(said) if reason == "CreateContainerConfigError" else None
    if as_root is not None:
        return RankProblem(rank, c.REASON_IMAGE_RUNS_AS_ROOT, as_root)
    if reason in PULL_FAILED_REASONS:
        said += pull_secrets_note(pod)
    return RankProblem(rank, WAITING_REASONS.get(reason, reason), said)


def pull_secrets_note(pod: Mapping[str, Any]) -> str:
    """What a failed pull was tried with: the pod's imagePullSecrets. The kubelet pulls without one
    that does not exist, and says so only in an Event on the pod (FailedToRetrieveImagePullSecret),
    so the registry's refusal ("no basic auth credentials") alone would not point at it."""
    names = [str(item["name"]) for item in (pod.get("spec") or {}).get("imagePullSecrets") or [] if item.get("name")]
    if not names:
        return ""
    return (f" (imagePullSecrets: {', '.join(names)}; the kubelet pulls without any that does not exist, "
            "saying so in the pod's events)")




def _exit_reason(reason: str, exit_code: Any) -> str:
    """The kubelet's reason for a failed container, or for its plain "Error" what the runtime's exit
    code means (CommunicationError, Hung, ...)."""
    if reason == "Error" and exit_code in c.RUNTIME_EXIT_REASONS:
        return str(c.RUNTIME_EXIT_REASONS[exit_code])
    return str(reason)


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
