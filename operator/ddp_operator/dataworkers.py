"""spec.dataWorkers, decided: their names and addresses, the env that points the ranks at them, what
their pods say (ready, held up, to replace) and the status that says it. Pure; the pods themselves
are built in manifests.py and made by the reconciler.

A data worker pod is not part of the gang: it is replaced alone (a crashed or OOM-killed container
is restarted by its kubelet, restartPolicy Always; a deleted, evicted or failed pod is made again by
the operator), never counts against a restart budget, and outlives gang restarts. The ranks' loader
moves a lost worker's batches to another and, with none left, makes them in the rank.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ddp_contract import envnames, labels
from ddp_contract.jobspec import JobSpec
from ddp_contract.jobstatus import STATUS_CONDITIONS, STATUS_DATA_WORKERS, StatusPatch
from ddp_operator import constants as c
from ddp_operator.conditions import get_condition, set_condition
from ddp_operator.failures import PodProblem
from ddp_operator.podstate import is_ready, rank_problem, trainer_status

TOKEN_KEY = "token"
DATA_WORKER_COMMAND = ("python", "-m", "ddp_trainer", "data-worker")
# The phases in which a job keeps its data workers; any other (finished, suspended, queued) removes them.
KEEPS_DATA_WORKERS = frozenset({c.PHASE_PENDING, c.PHASE_STARTING, c.PHASE_RUNNING, c.PHASE_RESTARTING})


def data_worker_name(job_name: str, index: int) -> str:
    return f"{job_name}-data-{index}"


def token_secret_name(job_name: str) -> str:
    """The Secret holding the job's token, which ranks and data workers read as env."""
    return f"{job_name}-data-token"


def data_worker_addresses(job_name: str, namespace: str, replicas: int) -> str:
    """DDP_DATA_WORKERS: each data worker's name under the job's headless Service, with its port."""
    port = envnames.DEFAULT_DATA_WORKER_PORT
    return ",".join(f"{data_worker_name(job_name, i)}.{job_name}.{namespace}.svc:{port}" for i in range(replicas))


def token_env(job_name: str, name: str = envnames.DATA_WORKER_TOKEN) -> dict[str, Any]:
    ref = {"name": token_secret_name(job_name), "key": TOKEN_KEY}
    return {"name": name, "valueFrom": {"secretKeyRef": ref}}


def rank_data_env(job_name: str, namespace: str, spec: JobSpec) -> list[dict[str, Any]]:
    """What a rank's loader needs to find its data workers and prove it belongs to the job; none
    without spec.dataWorkers (replicas 0 included: the loader then runs its workers locally)."""
    if spec.data_worker_replicas == 0:
        return []
    return [{"name": envnames.DATA_WORKERS,
             "value": data_worker_addresses(job_name, namespace, spec.data_worker_replicas)},
            token_env(job_name)]


@dataclass(frozen=True)
class DataWorkerSummary:
    """The job's data worker pods: which exist and are ready, which to make, which to remove."""

    desired: int
    ready: int = 0
    missing: tuple[int, ...] = ()  # indices with no pod (a pod being deleted still holds its name)
    remove: tuple[str, ...] = ()  # failed or evicted pods (made again once gone), and indices past replicas
    problems: tuple[PodProblem, ...] = ()  # by index: why a data worker is not ready
    uids: Mapping[str, str] = field(default_factory=dict)

    @property
    def short(self) -> bool:
        return self.ready < self.desired


def summarize_data_workers(pods: Iterable[Mapping[str, Any]], desired: int) -> DataWorkerSummary:
    """From the job's data worker pods (labelled with their index)."""
    ready = 0
    present: set[int] = set()
    remove: list[str] = []
    problems: list[PodProblem] = []
    uids: dict[str, str] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        name = str(meta.get("name", ""))
        uids[name] = str(meta.get("uid", ""))
        index = data_worker_index(meta)
        if index is None:
            continue
        present.add(index)
        if meta.get("deletionTimestamp"):
            continue
        phase = (pod.get("status") or {}).get("phase")
        if index >= desired:
            remove.append(name)
        elif phase in ("Failed", "Succeeded"):
            remove.append(name)
            problems.append(_ended(pod, index))
        elif phase == "Running" and is_ready(pod):
            ready += 1
        else:
            problem = rank_problem(pod, index) if phase != "Running" else _restarting(pod, index)
            if problem is not None:
                problems.append(problem)
    return DataWorkerSummary(
        desired=desired,
        ready=ready,
        missing=tuple(i for i in range(desired) if i not in present),
        remove=tuple(sorted(remove)),
        problems=tuple(sorted(problems, key=lambda p: p.index)),
        uids=uids,
    )


def data_worker_index(meta: Mapping[str, Any]) -> int | None:
    value = (meta.get("labels") or {}).get(labels.LABEL_DATA_WORKER)
    return int(value) if value is not None and str(value).isdigit() else None


def is_data_worker(pod: Mapping[str, Any]) -> bool:
    return labels.LABEL_DATA_WORKER in ((pod.get("metadata") or {}).get("labels") or {})


def _restarting(pod: Mapping[str, Any], index: int) -> PodProblem | None:
    """A running pod whose container is not ready: starting, or crashing (its last exit says why:
    OOMKilled, Error), which its kubelet restarts in place."""
    status = trainer_status(pod, labels.DATA_WORKER_CONTAINER_NAME)
    last = (status.get("lastState") or {}).get("terminated") or {}
    waiting = (status.get("state") or {}).get("waiting") or {}
    if not last and not waiting:
        return None
    restarts = int(status.get("restartCount") or 0)
    reason = str(last.get("reason") or waiting.get("reason") or "NotReady")
    said = f"restarted {restarts} time{'s' if restarts != 1 else ''}"
    if last:
        said += f", last exit {last.get('exitCode')} ({last.get('reason') or 'Error'})"
        if last.get("reason") == "OOMKilled":
            said += ": raise dataWorkers.resources.limits.memory, or lower the loader's prefetch_factor"
        elif last.get("message"):
            said += f": {str(last['message']).strip().splitlines()[-1]}"
    return PodProblem(index, reason, said)


def _ended(pod: Mapping[str, Any], index: int) -> PodProblem:
    status = pod.get("status") or {}
    reason = str(status.get("reason") or "Failed")
    message = str(status.get("message") or "the pod ended").strip()
    return PodProblem(index, reason, f"{message}; made again")


def keeps_data_workers(phase: str, queued: bool) -> bool:
    """Whether a job in `phase` (queued: waiting for Kueue to admit it) has its data workers."""
    return phase in KEEPS_DATA_WORKERS and not queued


def creates_data_workers(phase: str, queued: bool, gang_waits: bool) -> bool:
    """Whether a creation pass makes the data workers: never while the attempt's gang waits to be created
    (its attempt not yet recorded by the status pass), so that a quota with room for the gang alone holds
    the gang, not its helpers."""
    return keeps_data_workers(phase, queued) and not gang_waits


def data_worker_status(job_name: str, summary: DataWorkerSummary, *, phase: str, kept: bool,
                       refused: tuple[str, str] | None, conditions: Iterable[Mapping[str, Any]], now: datetime,
                       generation: int | None) -> StatusPatch:
    """The status fields for the job's data workers: `dataWorkers` and the DataWorkersReady condition.

    kept: keeps_data_workers(...); refused: (reason, message) of the API server's (or a quota's)
    refusal to create one, if any."""
    problems = [{"pod": data_worker_name(job_name, p.index), "reason": p.reason, "message": p.message}
                for p in summary.problems] if kept else []
    block: dict[str, Any] = {
        "desired": summary.desired, "ready": summary.ready, "summary": f"{summary.ready}/{summary.desired}",
        "problems": problems,
    }
    if not kept:
        state, reason, message = False, c.REASON_DATA_WORKERS_NOT_KEPT, f"the job is {phase}: it has no data workers now"
    elif not summary.short:
        state, reason, message = True, c.REASON_DATA_WORKERS_READY, f"{summary.ready}/{summary.desired} data workers ready"
    else:
        state = False
        reason, message = _why_short(job_name, summary, refused)
    return {STATUS_DATA_WORKERS: block,
            STATUS_CONDITIONS: set_condition(conditions, c.COND_DATA_WORKERS_READY, status=state, reason=reason, message=message,
                                        now=now, generation=generation)}


def _why_short(job_name: str, summary: DataWorkerSummary, refused: tuple[str, str] | None) -> tuple[str, str]:
    causes = [(p.reason, f"{data_worker_name(job_name, p.index)}: {p.reason}: {p.message}") for p in summary.problems]
    if refused is not None:
        causes.insert(0, refused)
    reason = causes[0][0] if causes else c.REASON_DATA_WORKERS_STARTING
    where = "the ready ones" if summary.ready else "the ranks' own pods"
    detail = "; ".join(text for _, text in causes)
    return reason, (f"{summary.ready}/{summary.desired} data workers ready{'; ' + detail if detail else ''}; "
                    f"until they are, the ranks' DataLoader workers run on {where}")


def data_worker_events(before: Iterable[Mapping[str, Any]], after: Iterable[Mapping[str, Any]]
                       ) -> list[tuple[str, str, str]]:
    """A Warning when data workers become short for a cause (not merely starting), or for another
    cause; a Normal Event when all are ready again."""
    old = get_condition(before, c.COND_DATA_WORKERS_READY) or {}
    new = get_condition(after, c.COND_DATA_WORKERS_READY) or {}
    if not new or (old.get("status"), old.get("reason")) == (new.get("status"), new.get("reason")):
        return []
    if new.get("status") == "True":
        return [("Normal", str(new.get("reason")), str(new.get("message")))] if old else []
    if new.get("reason") in (c.REASON_DATA_WORKERS_STARTING, c.REASON_DATA_WORKERS_NOT_KEPT):
        return []
    return [("Warning", str(new.get("reason")), str(new.get("message")))]
