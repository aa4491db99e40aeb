"""One pod of a job, read: its index, the attempt it was made for, its node and state, and what a failed
or held-up trainer says. The summaries of a job's pods (gangpods.py, the restart modes' rooms) are built
from these readings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ddp_contract import labels
from ddp_contract.timestamps import parse_rfc3339
from ddp_operator import constants as c
from ddp_operator.failures import PodProblem, RankFailure, last_lines
from ddp_operator.kubelet import EVICTION_REASON_PREFIX, EVICTION_REASONS, PULL_FAILED_REASONS, WAITING_NORMALLY, WAITING_REASONS
from ddp_operator.podsecurity import root_image_problem


class CachedPod(dict[str, Any]):
    """A pod as the pod cache keeps it (podwatch.slim_pod), with its reading (`view`, a PodView) once made.
    The cache replaces a pod's object whenever the pod changes and never changes one in place, so a reading
    holds as long as its object: a status pass reads again only the pods that changed since the last one
    (of a 10,000-pod gang, the pod whose event started it), not the whole gang."""

    __slots__ = ("view",)
    view: PodView


@dataclass(slots=True, eq=False)
class PodView:
    """What a summary needs of one pod, read once: a pass reads every pod of a job, 1,024 in the
    largest gangs (not frozen: a frozen dataclass is made several times slower; never change one).
    `index` is the pod's place in the job ('<job>-<index>'), the rank only when ranksPerPod is 1; None
    for a pod without the label."""

    pod: Mapping[str, Any]
    name: str
    uid: str
    job: str  # its job-name label
    index: int | None
    attempt: int | None  # the gang attempt it was created for
    node: str  # "" until it is bound to one
    state: str  # pending | running | succeeded | failed (pod_state)
    deleting: bool
    ready: bool = False  # its Ready condition is True
    started: str | None = None  # when its trainer container started running, if it runs

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> PodView:
        if type(pod) is CachedPod:
            view: PodView | None = getattr(pod, "view", None)
            if view is None:
                view = pod.view = cls.read(pod)
            return view
        return cls.read(pod)

    @classmethod
    def read(cls, pod: Mapping[str, Any]) -> PodView:
        meta = pod.get("metadata") or {}
        pod_labels = meta.get("labels") or {}
        status = pod.get("status") or {}
        trainer = (_trainer_status(status.get("containerStatuses")).get("state") or {})
        return cls(pod, meta.get("name", ""), meta.get("uid", ""), pod_labels.get(labels.LABEL_JOB_NAME, ""),
                   _int(pod_labels.get(labels.LABEL_RANK)), _int(pod_labels.get(labels.LABEL_ATTEMPT)),
                   (pod.get("spec") or {}).get("nodeName") or "", _state(status, trainer),
                   bool(meta.get("deletionTimestamp")), _ready(status),
                   _started(trainer))

    @property
    def active(self) -> bool:
        return self.state in ("pending", "running")


def _started(trainer_state: Mapping[str, Any]) -> str | None:
    started = (trainer_state.get("running") or {}).get("startedAt")
    return str(started) if started else None


def pod_state(pod: Mapping[str, Any]) -> str:
    """pending | running | succeeded | failed, judged by the trainer container first.

    The trainer's own exit decides, so a sidecar that keeps a pod Running does not hide a finished rank.
    """
    return _state(pod.get("status") or {}, trainer_status(pod).get("state") or {})


def _state(status: Mapping[str, Any], trainer_state: Mapping[str, Any]) -> str:
    terminated = trainer_state.get("terminated")
    if terminated is not None:
        return "succeeded" if terminated.get("exitCode") == 0 else "failed"
    return _PHASE_STATES.get(status.get("phase", "Pending"), "pending")


_PHASE_STATES = {"Running": "running", "Succeeded": "succeeded", "Failed": "failed"}


def trainer_status(pod: Mapping[str, Any], container: str = labels.CONTAINER_NAME) -> Mapping[str, Any]:
    """The status of the pod's `container` (the trainer), else of its first container."""
    return _trainer_status((pod.get("status") or {}).get("containerStatuses"), container)


def _trainer_status(statuses: list[Mapping[str, Any]] | None, container: str = labels.CONTAINER_NAME
                    ) -> Mapping[str, Any]:
    if not statuses:
        return {}
    for found in statuses:
        if found.get("name") == container:
            return found
    return statuses[0]


def is_ready(pod: Mapping[str, Any]) -> bool:
    return _ready(pod.get("status") or {})


def _ready(status: Mapping[str, Any]) -> bool:
    for cond in status.get("conditions") or ():
        if cond.get("type") == "Ready" and cond.get("status") == "True":
            return True
    return False


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


def rank_failure(pod: Mapping[str, Any], index: int) -> RankFailure:
    """The failure of the ranks of the pod of index `index`, whose trainer container ended in error."""
    terminated = (trainer_status(pod).get("state") or {}).get("terminated") or {}
    status = pod.get("status") or {}
    evicted = is_eviction(pod)
    exit_code = terminated.get("exitCode")
    if evicted:
        reason = status.get("reason") or _disruption_reason(status) or "Evicted"
    else:
        reason = exit_reason(terminated.get("reason") or status.get("reason") or "Failed", exit_code)
    return RankFailure(
        pod_index=index,
        pod=(pod.get("metadata") or {}).get("name", ""),
        exit_code=exit_code,
        reason=reason,
        evicted=evicted,
        finished_at=terminated.get("finishedAt"),
        node=(pod.get("spec") or {}).get("nodeName"),
        output=last_lines(terminated.get("message") or status.get("message")),
        attempt=label_int(pod.get("metadata") or {}, labels.LABEL_ATTEMPT),
    )


def node_lost(pod: Mapping[str, Any], index: int, why: str) -> RankFailure:
    """The failure of the ranks of the pod of index `index`, whose node is lost: an infrastructure
    failure (evicted), whatever the pod's last reported state says."""
    meta = pod.get("metadata") or {}
    return RankFailure(pod_index=index, pod=meta.get("name", ""), exit_code=None, reason=c.REASON_NODE_LOST, evicted=True,
                       node=(pod.get("spec") or {}).get("nodeName"), output=why,
                       attempt=label_int(meta, labels.LABEL_ATTEMPT))


def rank_problem(pod: Mapping[str, Any], index: int) -> PodProblem | None:
    """Why the pending pod of index `index` is held up, if anything says so: the scheduler (Unschedulable,
    with its message, e.g. "0/4 nodes are available: 4 Insufficient nvidia.com/gpu") or the kubelet (the
    trainer container waiting on an image pull, a missing Secret or ConfigMap, ...)."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("reason") == "Unschedulable":
            return PodProblem(index, c.REASON_UNSCHEDULABLE, str(cond.get("message") or "").strip())
    waiting = (trainer_status(pod).get("state") or {}).get("waiting") or {}
    reason = str(waiting.get("reason") or "")
    if not reason or reason in WAITING_NORMALLY:
        return None
    said = str(waiting.get("message") or reason).strip()
    as_root = root_image_problem(said) if reason == "CreateContainerConfigError" else None
    if as_root is not None:
        return PodProblem(index, c.REASON_IMAGE_RUNS_AS_ROOT, as_root)
    if reason in PULL_FAILED_REASONS:
        said += pull_secrets_note(pod)
    return PodProblem(index, WAITING_REASONS.get(reason, reason), said)


DEFAULT_SCHEDULER = "default-scheduler"
# How long a pending pod waits for the scheduler its spec.schedulerName names to place it or say why
# not, before the job says that none has: a scheduler that does not run answers nothing at all.
SCHEDULER_ANSWER_SECONDS = 30.0


def unanswered_for(pod: Mapping[str, Any], now: datetime) -> float | None:
    """Seconds the pending, unbound pod has waited on a scheduler other than the cluster's own (its
    spec.schedulerName) that has not yet said anything of it (no PodScheduled condition); None where one
    has, or the pod names the cluster's own."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    scheduler = spec.get("schedulerName")
    if not scheduler or scheduler == DEFAULT_SCHEDULER or spec.get("nodeName") or status.get("phase") not in (None, "Pending"):
        return None
    if any(cond.get("type") == "PodScheduled" for cond in status.get("conditions") or []):
        return None
    created = parse_rfc3339((pod.get("metadata") or {}).get("creationTimestamp"))
    return None if created is None else max(0.0, (now - created).total_seconds())


def unanswered_problem(pod: Mapping[str, Any], index: int, waited: float) -> PodProblem:
    scheduler = (pod.get("spec") or {}).get("schedulerName")
    return PodProblem(index, c.REASON_NOT_SCHEDULED,
                      f"no scheduler has placed it or said why in {waited:.0f} s: its schedulerName {scheduler!r} names "
                      f"a scheduler that has not answered; check that it runs (the cluster's own is {DEFAULT_SCHEDULER})")


def pull_secrets_note(pod: Mapping[str, Any]) -> str:
    """What a failed pull was tried with: the pod's imagePullSecrets. The kubelet pulls without one
    that does not exist, and says so only in an Event on the pod (FailedToRetrieveImagePullSecret),
    so the registry's refusal ("no basic auth credentials") alone would not point at it."""
    names = [str(item["name"]) for item in (pod.get("spec") or {}).get("imagePullSecrets") or [] if item.get("name")]
    if not names:
        return ""
    return (f" (imagePullSecrets: {', '.join(names)}; the kubelet pulls without any that does not exist, "
            "saying so in the pod's events)")


def exit_reason(reason: str, exit_code: Any) -> str:
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


def label_int(meta: Mapping[str, Any], key: str) -> int | None:
    return _int((meta.get("labels") or {}).get(key))


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
