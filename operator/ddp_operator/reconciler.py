"""Reconciling a DDPJob: read the job and its pods, decide, act, record status.

A status pass (`reconcile`), run for a job whenever it or one of its pods changes:
    summary  = read_pods(pods of the job, spec, status, nodes, memory)    jobpods.py
      (summarize_pods, with the mode's gang and window: modes.of;        podsummary.py, modes/
      + ranks held up by names in the way, refusals, a gang too large)   capacity.py
    decision = decide(spec, status, summary, now)                        decision.py
    patch status with compute_status(...) first                          statuspatch.py
      (a count-only patch may wait: COUNTS_INTERVAL, growing to 30 s)    timers.py
    delete decision.delete_pods, each by the uid the summary saw
    force-delete summary.lost_pods (Terminating on a lost node: no kubelet will finish them)
    hand the job to the creation queue when the decision is Create
    for a job in a Kueue queue: create its Workload, hand its quota back once an evicted (or
      suspended) gang's pods are gone, mark it Finished with the job        kueue/
    return when to look again: look_again(what the pass found)           timers.py
A creation pass (`create_children`) decides again from what the cluster holds now and creates the
Service, the progress identity and the free ranks' pods (creation.py), only for the attempt status records; it runs
on its own queue, so a job whose gang just became Running never waits behind other jobs' creations.
It writes no status: what it could not create (a name in the way, a refusal, a quota too small for the
whole gang) is kept in the job's `JobMemory` (jobmemory.py) and said by the next status pass, the only writer.
A gang restart therefore takes several passes: delete, then create each rank once its name is free.

All judgement lives in pure functions (spec.py, manifests.py and the modules above); this module
carries their decisions out against the API, and is level-triggered: every pass starts from what
the cluster holds now, so an operator restarted at any moment carries on where it was.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.rest import ApiException

from ddp_contract import api
from ddp_contract.jobspec import JobSpec
from ddp_contract.jobstatus import STATUS_CONDITIONS, STATUS_PHASE
from ddp_contract.resource import JobKey, JobStatus, job_key
from ddp_operator import constants as c
from ddp_operator import metrics
from ddp_operator.creation import Creation
from ddp_operator.dataworkers import (
    DataWorkerSummary,
    creates_data_workers,
    data_worker_status,
    is_data_worker,
    keeps_data_workers,
    summarize_data_workers,
)
from ddp_operator.deadlines import ttl_expired
from ddp_operator.decision import Action, decide
from ddp_operator.events import post_event
from ddp_operator.jobmemory import JobMemory
from ddp_operator.jobpods import read_pods
from ddp_operator.kubeapi import KubeApi, api_message, is_controlled_by, is_going_away
from ddp_operator.kueue.gate import KueueGate
from ddp_operator.kueue.multikueue import Role, role
from ddp_operator.kueue.rules import Gate, QueueState, queue_name
from ddp_operator.kueue.workloads import WorkloadCache
from ddp_operator.listwatch import owning_job_key
from ddp_operator.nodes import Nodes
from ddp_operator.passerrors import RetryLater, describe_error, failed_pass_message, is_transient
from ddp_operator.placement import ANYWHERE, GangPlacement
from ddp_operator.podstate import PodView
from ddp_operator.podsummary import PodSummary
from ddp_operator.podwatch import PodCache
from ddp_operator.spec import InvalidSpec, parse_spec, validate_job_name
from ddp_operator.statuspatch import (
    changed_fields,
    compute_status,
    events_for,
    failed_pass_status,
    invalid_spec_status,
    next_phase,
    only_counts_changed,
)
from ddp_operator.timers import WORKLOADS_UNSYNCED_RECHECK, Found, counts_wait, look_again, quota_wait
from ddp_operator.topology import NoDomain, choose_domains, room_by_domain, running_domains, used_by_node
from ddp_operator.workqueue import WorkQueue

log = logging.getLogger(__name__)
# A pod whose delete was issued is not deleted again by later passes for this long (they still see
# it until its deletionTimestamp reaches the pod watch); past it, a pod still there is asked again.
DELETE_REISSUE_AFTER = 30.0
# The work queues' names in the metrics.
STATUS_QUEUE = "status"
CREATION_QUEUE = "creation"
# A job's next status pass waits this many times as long as its last one took to read the pods and
# decide: the passes of a 10,000-pod gang coming up (tens of milliseconds each, one asked for by each
# pod event) then hold the event loop, and the interpreter's lock, a third of the time at most, and the
# threads creating its pods get the rest. A job of a few pods waits a millisecond.
PASS_PACE = 2.0


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
        key = job_key(job)
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

    def all(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._jobs.values())


class Reconciler:
    """Two keyed queues drive it: `queue` runs status passes, `creations` runs creation passes."""

    def __init__(self, kube: KubeApi, *, jobs: JobStore, pods: PodCache, nodes: Callable[[], Nodes] = Nodes,
                 workers: int = 32, workloads: WorkloadCache | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """clock: the monotonic time its waits and delete reissues are measured by."""
        self.kube = kube
        self.clock = clock
        self.jobs = jobs
        self.pods = pods
        self.nodes = nodes
        self.kueue = KueueGate(kube, workloads) if workloads is not None else None
        self._memory: dict[JobKey, JobMemory] = {}
        self._deleting: dict[tuple[str, bool], float] = {}  # (uid, forced) -> monotonic time its delete was issued
        self.queue = WorkQueue(self.reconcile, workers=workers, name=STATUS_QUEUE, pace=self._pace)
        self.creations = WorkQueue(self.create_children, workers=workers, name=CREATION_QUEUE)
        self.create = Creation(kube, self._of, self.add, lambda: self.clock(), placer=self._placement)

    def start(self) -> None:
        self.queue.start()
        self.creations.start()

    async def stop(self) -> None:
        await self.queue.stop()
        await self.creations.stop()

    def add(self, key: JobKey) -> None:
        """Schedules a status pass for the job (coalesced with any pending one)."""
        self.queue.add(key)

    def add_threadsafe(self, loop: asyncio.AbstractEventLoop, key: JobKey) -> None:
        self.queue.add_threadsafe(loop, key)

    def forget(self, key: JobKey) -> None:
        self.queue.forget(key)
        self.creations.forget(key)
        self._memory.pop(key, None)
        if self.kueue is not None:
            self.kueue.forget(key)

    def _of(self, key: JobKey) -> JobMemory:
        return self._memory.setdefault(key, JobMemory())

    def _pace(self, key: JobKey) -> float:
        memory = self._memory.get(key)
        return PASS_PACE * memory.read_seconds if memory is not None else 0.0

    async def reconcile(self, key: JobKey) -> float | None:
        """The status pass: decide, record status, delete, and hand pod creation to `creations`. One that
        raises says why on the job and raises RetryLater, for the queue to try again with backoff."""
        try:
            wait = await self._status_pass(key)
        except Exception as error:
            message, new = self._failed(key, error, "status pass")
            await self._say_failed(key, message, new)
            raise RetryLater(message) from error
        return wait

    async def _status_pass(self, key: JobKey) -> float | None:
        current = await self._current(key, record_invalid=True)
        if current is None:
            return None
        job, spec, status, now = current
        if ttl_expired(JobStatus.of(status), spec, now):
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

    async def create_children(self, key: JobKey) -> None:
        """The creation pass, run by `creations`: decides again from what the cluster holds now
        and creates the missing children, so a stale request creates nothing. What it could not make
        for a cause of the job's own is kept for the status pass to say (Creation); anything else that
        raises is logged and raised as RetryLater: the status pass, running the same reading first, says it."""
        try:
            await self._creation_pass(key)
        except Exception as error:
            raise RetryLater(self._failed(key, error, "creation pass")[0]) from error

    async def _creation_pass(self, key: JobKey) -> None:
        current = await self._current(key, record_invalid=False)
        if current is None:
            return
        job, spec, status, now = current
        if spec.managed_by != api.MANAGED_BY_OPERATOR:  # its pods, if any, are made on another cluster
            return
        queue = self._queue(job, spec, status)
        if queue is not None and queue.gate == Gate.UNKNOWN:
            return
        own = self._own_pods(job)
        made = self._awaited(key, own[0], JobStatus.of(status).attempt)
        if made is not None:  # the watch has not brought all of the last pass's pods yet
            self.creations.add_after(key, made)
            return
        summary = self._summary(job, status, spec, now, own[0])
        decision = decide(spec, status=status, summary=summary, now=now, queue=queue)
        # Status first: until the status pass has recorded this attempt, it is not ours to create.
        creating = decision.action == Action.CREATE
        recorded = decision.attempt == JobStatus.of(status).attempt
        try:
            if creating and recorded:
                # The namespace's quotas are judged for the whole gang before an attempt's first pod (the
                # old attempt's pods, still counted until they are gone, are left out of what the quota
                # has used); later passes create the ranks whose names have come free since, or an elastic
                # job's ranks left out, judged again.
                live = len(summary.live_indices)
                await self.create.gang(job, spec, decision.create_indices, decision.attempt, live=live,
                                       leaving=0 if live else len(summary.uids))
            # Not before the gang has a pod: a pass that makes none of its pods (an attempt not yet recorded,
            # or a decision to wait) would let a data worker take the room a quota keeps for the gang.
            if creates_data_workers(next_phase(status, summary, decision, spec), decision.action == Action.QUEUE,
                                    gang_waits=(creating and not recorded) or summary.total == 0):
                await self.create.data_workers(job, spec, self._data_workers(spec, own))
        except ApiException as error:
            if not is_going_away(error):
                raise

    async def _current(self, key: JobKey, record_invalid: bool
                       ) -> tuple[dict[str, Any], JobSpec, Mapping[str, Any], datetime] | None:
        """The job as last seen, with its parsed spec; None if it is gone, going, or invalid."""
        job = self.jobs.get(key)
        if job is None or job["metadata"].get("deletionTimestamp"):
            return None  # ownerReferences let the garbage collector remove the children
        now = datetime.now(UTC)
        status = job.get("status") or {}
        try:
            spec = parse_spec(job.get("spec") or {})
            validate_job_name(job["metadata"]["name"], spec.world_size + spec.spare_pods, spec.data_worker_replicas)
        except InvalidSpec as error:
            if record_invalid:
                await self._record(job, invalid_spec_status(error, status, now, job["metadata"].get("generation")))
            return None
        return job, spec, status, now

    def _awaited(self, key: JobKey, rank_pods: list[dict[str, Any]], attempt: int) -> float | None:
        """JobMemory.awaited, on the pods the cache holds now (read only while the creation pass made some)."""
        memory = self._of(key)
        if not memory.unseen:
            return None
        cached = {(pod["metadata"]["name"], PodView.of(pod).attempt) for pod in rank_pods}
        return memory.awaited(cached, self.clock(), attempt)

    def _rank_pods(self, job: Mapping[str, Any]) -> list[dict[str, Any]]:
        return self._own_pods(job)[0]

    @staticmethod
    def _data_workers(spec: JobSpec, own: tuple[list[dict[str, Any]], list[dict[str, Any]]]) -> DataWorkerSummary:
        return summarize_data_workers(own[1], spec.data_worker_replicas)

    def _own_pods(self, job: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The job's pods by owner, not by label alone, as (ranks' pods, data workers' pods): a pod with
        its labels that it does not control (orphaned from a predecessor of the same name, made by hand)
        is never counted, adopted or deleted; where it holds a rank's name, creating that rank says so
        (NameInUse). Read once a pass: at 10,000 ranks each reading costs milliseconds."""
        ranks: list[dict[str, Any]] = []
        workers: list[dict[str, Any]] = []
        for pod in self.pods.pods(job_key(job)):
            if is_controlled_by(pod["metadata"], job):
                (workers if is_data_worker(pod) else ranks).append(pod)
        return ranks, workers

    def _summary(self, job: Mapping[str, Any], status: Mapping[str, Any], spec: JobSpec, now: datetime,
                 rank_pods: list[dict[str, Any]]) -> PodSummary:
        key = job_key(job)
        return read_pods(rank_pods, spec=spec, status=status, job_name=key[1],
                         generation=job["metadata"].get("generation"), nodes=self.nodes(), memory=self._of(key),
                         deleting={uid for uid, _ in self._deleting}, now=now)

    async def _reconcile(self, job: dict[str, Any], spec: JobSpec, status: Mapping[str, Any], now: datetime) -> float | None:
        name = job["metadata"]["name"]
        queue = self._queue(job, spec, status)
        if queue is not None and queue.gate == Gate.UNKNOWN:  # nothing is done until Kueue's word is known
            return WORKLOADS_UNSYNCED_RECHECK
        doing = role(spec.managed_by, queue, status.get(STATUS_PHASE))
        if doing == Role.ELSEWHERE:
            return None
        if doing == Role.DISPATCHED:
            if self.kueue is not None:
                await self.kueue.sync(job, spec, status=status, now=now, has_pods=False)
            return None
        key = (job["metadata"]["namespace"], name)
        reading = time.perf_counter()
        own = self._own_pods(job)
        self._awaited(key, own[0], JobStatus.of(status).attempt)  # forgets the pods made that the cache holds now
        summary = self._summary(job, status, spec, now, own[0])
        decision = decide(spec, status=status, summary=summary, now=now, queue=queue)
        log.debug("%s/%s: %s", job["metadata"]["namespace"], name, decision)
        # Status first: if an action below fails, the next pass repeats it from the recorded
        # attempt instead of counting the same restart twice.
        patch = compute_status(spec, status=status, summary=summary, decision=decision, now=now,
                               generation=job["metadata"].get("generation"))
        workers = self._data_workers(spec, own)
        keep_workers = keeps_data_workers(patch[STATUS_PHASE], decision.action == Action.QUEUE)
        if spec.data_workers is not None:
            refused = self._of(key).data_refused
            patch.update(data_worker_status(name, workers, phase=patch[STATUS_PHASE], kept=keep_workers,
                                            refused=(refused.reason, refused.message) if refused else None,
                                            conditions=patch[STATUS_CONDITIONS], now=now,
                                            generation=job["metadata"].get("generation")))
        memory = self._of(key)
        memory.read_seconds = time.perf_counter() - reading
        clock = self.clock()
        held = counts_wait(status, patch, clock - memory.patched_at,
                           clock - memory.changed_at if memory.changed_at is not None else 0.0)
        if held is None:
            await self._record(job, patch)
        await self._delete(job, decision.delete_pods, summary.uids)
        await self._delete(job, summary.lost_pods, summary.uids, force=True)
        # Data workers outlive gang restarts; they go with the job's end, suspension or queueing.
        await self._delete(job, workers.remove if keep_workers else tuple(workers.uids), workers.uids)
        if keep_workers and workers.missing:
            self.creations.add(key)
        if self.kueue is not None:
            await self.kueue.sync(job, spec, status={**status, **patch}, now=now, has_pods=bool(own[0] or own[1]))
        creating = decision.action == Action.CREATE
        quota_held = quota_wait(self._of(key).refused, decision.attempt, self.clock()) if creating else None
        if creating and quota_held is None:
            # Not awaited here: a pass that waited on pod creation would hold its worker while
            # other jobs' status (a gang that just became Running) waits in the queue.
            self.creations.add(key)
        memory = self._of(key)
        return look_again(Found(
            spec, JobStatus.of({**status, **patch}), now, self.nodes(), bound=summary.nodes,
            decided=decision.recheck_after, counts_held=held, quota_held=quota_held, in_the_way=bool(memory.in_the_way),
            data_workers_refused=keep_workers and memory.data_refused is not None,
            workload_retry=self.kueue.recheck_after(key) if self.kueue is not None else None,
            scheduler_due=summary.scheduler_due))

    async def _placement(self, job: dict[str, Any], spec: JobSpec) -> GangPlacement:
        """Where the gang's pods go: where Kueue admitted a queued job, else into spec.topology's domains
        (topology.py; raises NoDomain when a required one has no room, or the nodes are not listed yet)."""
        if self.kueue is not None and queue_name(job) is not None:
            return await self.kueue.placement(job, spec)
        if spec.topology is None:
            return ANYWHERE
        nodes = self.nodes()
        if not nodes.synced:
            raise NoDomain("the operator has not listed the nodes yet")
        key = job_key(job)
        attempt = JobStatus.of(job.get("status") or {}).attempt
        running = running_domains(self._rank_pods(job), attempt, nodes, spec.topology.key)
        used = used_by_node(pod for pod in self.pods.every_object() if owning_job_key(pod) != key)
        room = room_by_domain(spec, nodes.known.values(), used)
        return GangPlacement(ranks=choose_domains(spec, room, running))

    def _queue(self, job: Mapping[str, Any], spec: JobSpec, status: Mapping[str, Any]) -> QueueState | None:
        """For a job in a Kueue queue, what its Workload allows (KueueGate.state); None for any other."""
        return self.kueue.state(job, spec, status) if self.kueue is not None else None

    async def _delete(self, job: Mapping[str, Any], names: tuple[str, ...], uids: Mapping[str, str],
                      force: bool = False) -> None:
        """Deletes each named pod (the one with the uid the decision saw), once: the passes that follow
        a gang restart still see pods whose deletion has not reached the pod watch yet. force: at once
        (grace period 0), for pods on a lost node; a pod deleted gracefully before may be forced after."""
        namespace = job["metadata"]["namespace"]
        now = self.clock()
        for issued_key, issued in list(self._deleting.items()):
            if now - issued > DELETE_REISSUE_AFTER:
                del self._deleting[issued_key]
        todo = [(name, uids[name]) for name in names if uids.get(name) and (uids[name], force) not in self._deleting]
        self._deleting.update(((uid, force), now) for _, uid in todo)
        results = await asyncio.gather(*(self.kube.delete_pod(namespace, name, uid, force=force) for name, uid in todo),
                                       return_exceptions=True)
        failed = [(uid, r) for (_, uid), r in zip(todo, results, strict=True) if isinstance(r, BaseException)]
        for uid, _ in failed:
            self._deleting.pop((uid, force), None)  # not deleted: the next pass tries again
        if failed:
            raise failed[0][1]

    def _failed(self, key: JobKey, error: Exception, what: str) -> tuple[str, bool]:
        """Why a pass raised, in words for the job, and whether they are new: the traceback is logged the
        first time they come up for the job. An error of the API server or the network is raised again
        as RetryLater: the queue logs it in a line and tries again."""
        if is_transient(error):
            raise RetryLater(f"{what}: {describe_error(error)}", logging.WARNING) from error
        message = failed_pass_message(error, what)
        said = self._of(key).failures_said
        new = message not in said
        if new:
            said.add(message)
            log.error("%s/%s: %s", *key, message, exc_info=error)
        return message, new

    async def _say_failed(self, key: JobKey, message: str, new: bool) -> None:
        """Says on the job why its status pass failed: status.reason ReconcileError with the message (an
        ended job keeps why it ended), and a Warning Event, once for the same words."""
        job = self.jobs.get(key)
        if job is None or job["metadata"].get("deletionTimestamp"):
            return
        patch = failed_pass_status(job.get("status") or {}, message)
        if patch is not None:
            try:
                job = await self.kube.patch_job_status(*key, patch)
            except ApiException as error:
                log.warning("%s/%s: could not say on the job why its status pass failed: %s", *key,
                            api_message(error))
                return
            self.jobs.put(job)
        if patch is not None or new:
            await post_event(self.kube, job, type_="Warning", reason=c.REASON_RECONCILE_ERROR, message=message)

    async def _record(self, job: dict[str, Any], patch: Mapping[str, Any]) -> None:
        """Patches status when it changed, keeps the answer, and announces a new phase as an Event."""
        status = job.get("status") or {}
        if not changed_fields(status, patch):
            return
        meta = job["metadata"]
        memory = self._of((meta["namespace"], meta["name"]))
        memory.patched_at = self.clock()
        if memory.changed_at is None or not only_counts_changed(status, patch):
            memory.changed_at = memory.patched_at
        updated = await self.kube.patch_job_status(meta["namespace"], meta["name"], patch)
        self.jobs.put(updated)
        metrics.status_recorded(job, status, patch, datetime.now(UTC))
        for kind, reason, message in events_for(status, patch):
            log.info("%s/%s: %s -> %s (%s) %s", meta["namespace"], meta["name"], status.get(STATUS_PHASE),
                     patch.get(STATUS_PHASE), reason, message)
            await post_event(self.kube, updated, type_=kind, reason=reason, message=message)
