"""One reconcile pass of a DDPJob: read the job and its pods, decide, act, record status.

All judgement lives in the pure functions of spec.py, manifests.py and status.py; this module only
carries their decisions out against the API, and is level-triggered: every pass starts from what
the cluster holds now, so an operator restarted at any moment carries on where it was.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from datetime import datetime, timezone
from typing import Any, Mapping

from kubernetes.client.rest import ApiException

from ddp_operator import constants as c
from ddp_operator.events import post_event
from ddp_operator.kubeapi import KubeApi, adopt, api_message, is_going_away
from ddp_operator.manifests import build_pod, build_progress_access, build_service
from ddp_operator.podwatch import JobKey, PodCache
from ddp_operator.spec import InvalidSpec, JobSpec, parse_spec, validate_job_name
from ddp_operator.status import (
    Action,
    compute_status,
    decide,
    invalid_spec_status,
    requeue_after,
    summarize_pods,
    ttl_expired,
)

log = logging.getLogger(__name__)
WARNING_PHASES = frozenset({c.PHASE_FAILED, c.PHASE_RESTARTING})
# Fields of status this operator owns; progress is the trainer's.
OWNED_STATUS = (
    "phase", "attempt", "restarts", "readyRanks", "totalRanks", "ready", "reason", "message", "startTime",
    "completionTime", "conditions", "observedGeneration", "failedRank",
)


def resource_version(job: Mapping[str, Any]) -> int:
    try:
        return int(job.get("metadata", {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


class JobStore:
    """The newest copy of every DDPJob, fed by the watch and by our own status patches."""

    def __init__(self) -> None:
        self._jobs: dict[JobKey, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def put(self, job: Mapping[str, Any]) -> None:
        key = (job["metadata"]["namespace"], job["metadata"]["name"])
        with self._lock:
            known = self._jobs.get(key)
            # A watch event may trail our own patch's answer; keep whichever is newer.
            if known is None or resource_version(job) >= resource_version(known) \
                    or known["metadata"].get("uid") != job["metadata"].get("uid"):
                self._jobs[key] = dict(job)

    def get(self, key: JobKey) -> dict[str, Any] | None:
        with self._lock:
            return self._jobs.get(key)

    def remove(self, key: JobKey) -> None:
        with self._lock:
            self._jobs.pop(key, None)

    def __len__(self) -> int:
        return len(self._jobs)


def status_changed(current: Mapping[str, Any], patch: Mapping[str, Any]) -> bool:
    return any(current.get(field) != patch.get(field) for field in patch if field in OWNED_STATUS)


class Reconciler:
    def __init__(self, kube: KubeApi, jobs: JobStore, pods: PodCache) -> None:
        self.kube = kube
        self.jobs = jobs
        self.pods = pods

    async def __call__(self, key: JobKey) -> float | None:
        job = self.jobs.get(key)
        if job is None or job["metadata"].get("deletionTimestamp"):
            return None  # ownerReferences let the garbage collector remove the children
        now = datetime.now(timezone.utc)
        status = job.get("status") or {}
        try:
            spec = parse_spec(job.get("spec") or {})
            validate_job_name(job["metadata"]["name"], spec.world_size)
        except InvalidSpec as error:
            await self._record(job, invalid_spec_status(error, status, now, job["metadata"].get("generation")))
            return None
        if ttl_expired(status, spec, now):
            log.info("deleting %s/%s: ttlSecondsAfterFinished passed", *key)
            await self.kube.delete_job(*key)
            return None
        try:
            return await self._reconcile(job, spec, status, now)
        except ApiException as error:
            if not is_going_away(error):
                raise
            log.debug("%s/%s is being deleted: %s", *key, api_message(error))
            return None

    async def _reconcile(self, job: dict[str, Any], spec: JobSpec, status: Mapping[str, Any], now: datetime) -> float | None:
        name = job["metadata"]["name"]
        summary = summarize_pods(self.pods.pods((job["metadata"]["namespace"], name)),
                                 int(status.get("attempt", 0)), name)
        decision = decide(spec, status, summary, now)
        log.debug("%s/%s: %s", job["metadata"]["namespace"], name, decision)
        # Status first: if an action below fails, the next pass repeats it from the recorded
        # attempt instead of counting the same restart twice.
        patch = compute_status(spec, status, summary, decision, now, job["metadata"].get("generation"))
        await self._record(job, patch)
        await self._delete(job, decision.delete_pods)
        if decision.action == Action.CREATE:
            try:
                await self._create(job, spec, decision.create_ranks, decision.attempt)
            except ApiException as error:
                if error.status not in (400, 422):
                    raise
                # The API refused the pod itself: a template mistake the schema cannot see.
                invalid = InvalidSpec("template", f"the pod for this job was refused: {api_message(error)}")
                failed = self.jobs.get((job["metadata"]["namespace"], job["metadata"]["name"])) or job
                await self._record(failed, invalid_spec_status(invalid, failed.get("status") or {}, now,
                                                               job["metadata"].get("generation")))
                return None
        return requeue_after({**status, **patch}, spec, now)

    async def _create(self, job: dict[str, Any], spec: JobSpec, ranks: tuple[int, ...], attempt: int) -> None:
        # In order: a RoleBinding is refused (404) while its Role does not exist yet, unless the
        # caller may bind anything (an admin may; the operator's own ClusterRole may not).
        for child in (build_service(job, spec), *build_progress_access(job, spec)):
            await self.kube.ensure(adopt(child, job))
        pods = [adopt(build_pod(job, spec, rank, attempt), job) for rank in ranks]
        results = await asyncio.gather(*(self.kube.create_pod(pod) for pod in pods), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]

    async def _delete(self, job: Mapping[str, Any], names: tuple[str, ...]) -> None:
        namespace = job["metadata"]["namespace"]
        await asyncio.gather(*(self.kube.delete_pod(namespace, pod) for pod in names))

    async def _record(self, job: dict[str, Any], patch: Mapping[str, Any]) -> None:
        """Patches status when it changed, keeps the answer, and announces a new phase as an Event."""
        status = job.get("status") or {}
        if not status_changed(status, patch):
            return
        meta = job["metadata"]
        updated = await self.kube.patch_job_status(meta["namespace"], meta["name"], patch)
        self.jobs.put(updated)
        phase = patch.get("phase")
        if phase and phase != status.get("phase"):
            kind = "Warning" if phase in WARNING_PHASES else "Normal"
            reason = patch.get("reason") or phase
            message = patch.get("message") or f"phase {phase}"
            log.info("%s/%s: %s -> %s (%s) %s", meta["namespace"], meta["name"], status.get("phase"), phase,
                     reason, message)
            await post_event(self.kube, updated, kind, reason, message)
