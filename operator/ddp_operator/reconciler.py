"""Reconciling a DDPJob: read the job and its pods, decide, act, record status.

A status pass (`reconcile`), run for a job whenever it or one of its pods changes:
    lost     = lost_nodes(the pods' nodes, the node watch's view)      nodes.py
    summary  = summarize_pods(pods of the job, status.attempt, lost)  podsummary.py
      + ranks held up by names in the way, or by a gang too large     capacity.py
    decision = decide(spec, status, summary, now)                     decision.py
      (an elastic job's gang: status.members; when to resize it         elastic.py)
    patch status with compute_status(...) first                       statuspatch.py
      (a count-only patch may wait up to COUNTS_INTERVAL)
    delete decision.delete_pods, each by the uid the summary saw
    force-delete summary.lost_pods (Terminating on a lost node: no kubelet will finish them)
    hand the job to the creation queue when the decision is Create
    for a job in a Kueue queue: create its Workload, hand its quota back once an evicted (or
      suspended) gang's pods are gone, mark it Finished with the job        kueue/
A creation pass (`create_children`) decides again from what the cluster holds now and creates the
Service, the progress identity and the free ranks' pods, only for the attempt status records; it runs
on its own queue, so a job whose gang just became Running never waits behind other jobs' creations.
It writes no status: what it could not create (a name in the way, a refusal, a quota too small for the
whole gang) is kept in the job's `JobMemory` and said by the next status pass, the only writer.
A gang restart therefore takes several passes: delete, then create each rank once its name is free.

All judgement lives in pure functions (spec.py, manifests.py and the modules above); this module
carries their decisions out against the API, and is level-triggered: every pass starts from what
the cluster holds now, so an operator restarted at any moment carries on where it was.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.rest import ApiException

from ddp_contract import api
from ddp_operator import constants as c
from ddp_operator import elastic, metrics
from ddp_operator.admission import Refusal, Refused, classify, refused
from ddp_operator.capacity import InTheWay, gang_too_large
from ddp_operator.dataworkers import (
    DataWorkerSummary,
    data_worker_status,
    is_data_worker,
    keeps_data_workers,
    summarize_data_workers,
)
from ddp_operator.deadlines import requeue_after, ttl_expired
from ddp_operator.decision import Action, decide
from ddp_operator.events import post_event
from ddp_operator.failures import RankProblem
from ddp_operator.kubeapi import KubeApi, adopt, api_message, is_controlled_by, is_going_away
from ddp_operator.kueue.gate import KueueGate
from ddp_operator.kueue.rules import Gate, QueueState, queue_name
from ddp_operator.kueue.workloads import WorkloadCache
from ddp_operator.listwatch import JobKey
from ddp_operator.manifests import (
    build_data_worker_pod,
    build_pod,
    build_progress_access,
    build_service,
    build_token_secret,
)
from ddp_operator.nodes import NodeInfo, Nodes, lost_nodes, seconds_until_lost
from ddp_operator.podsummary import PodSummary, summarize_pods
from ddp_operator.podwatch import PodCache
from ddp_operator.quota import gang_shortfall, pods_that_fit
from ddp_operator.spec import InvalidSpec, JobSpec, parse_spec, validate_job_name
from ddp_operator.statuspatch import (
    changed_fields,
    compute_status,
    events_for,
    invalid_spec_status,
    next_phase,
    only_counts_changed,
    pod_attempt_floor,
)
from ddp_operator.workqueue import WorkQueue

log = logging.getLogger(__name__)
# A job's status is patched at most this often for rank counts alone (readyRanks 3/8 -> 4/8), so a
# gang coming up writes a few times, not once per pod, and a phase change never queues behind them.
COUNTS_INTERVAL = 1.0
# A pod whose delete was issued is not deleted again by later passes for this long (they still see
# it until its deletionTimestamp reaches the pod watch); past it, a pod still there is asked again.
DELETE_REISSUE_AFTER = 30.0
# Seconds between looks at objects holding a job's names, which no watch of ours reports.
IN_THE_WAY_RECHECK = 5.0
# Seconds between tries to create data workers the API server (or a quota) refused.
DATA_WORKERS_REFUSED_RECHECK = 10.0
# Seconds between passes for a queued job while the Workload watch has not listed them yet.
WORKLOADS_UNSYNCED_RECHECK = 1.0
# The work queues' names in the metrics.
STATUS_QUEUE = "status"
CREATION_QUEUE = "creation"


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

    def all(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._jobs.values())


@dataclass
class JobMemory:
    """What the reconciler keeps of one job between passes: none of it is status, and an operator that
    starts again rebuilds it in its first passes."""

    patched_at: float = float("-inf")  # monotonic time of the job's last status patch
    in_the_way: InTheWay = InTheWay()  # what the last creation pass found holding the job's names
    fit: tuple[Mapping[str, NodeInfo], Any, str | None] | None = None  # gang_too_large: nodes, generation, verdict
    refused: Refused | None = None  # what the API server (or a quota) refused the last creation pass
    data_refused: Refusal | None = None  # what it refused of the job's data workers, last time


class Reconciler:
    """Two keyed queues drive it: `queue` runs status passes, `creations` runs creation passes."""

    def __init__(self, kube: KubeApi, jobs: JobStore, pods: PodCache, nodes: Callable[[], Nodes] = Nodes,
                 workers: int = 32, workloads: WorkloadCache | None = None) -> None:
        self.kube = kube
        self.jobs = jobs
        self.pods = pods
        self.nodes = nodes
        self.kueue = KueueGate(kube, workloads) if workloads is not None else None
        self._memory: dict[JobKey, JobMemory] = {}
        self._deleting: dict[tuple[str, bool], float] = {}  # (uid, forced) -> monotonic time its delete was issued
        self._unreadable_quotas: set[str] = set()  # namespaces whose ResourceQuotas we may not list (said once)
        self.queue = WorkQueue(self.reconcile, workers=workers, name=STATUS_QUEUE)
        self.creations = WorkQueue(self.create_children, workers=workers, name=CREATION_QUEUE)

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

    async def reconcile(self, key: JobKey) -> float | None:
        """The status pass: decide, record status, delete, and hand pod creation to `creations`."""
        current = await self._current(key, record_invalid=True)
        if current is None:
            return None
        job, spec, status, now = current
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

    async def create_children(self, key: JobKey) -> None:
        """The creation pass, run by `creations`: decides again from what the cluster holds now
        and creates the missing children, so a stale request creates nothing."""
        current = await self._current(key, record_invalid=False)
        if current is None:
            return
        job, spec, status, now = current
        queue = self._queue(job, spec, status)
        if queue is not None and queue.gate == Gate.UNKNOWN:
            return
        summary = self._summary(job, status, spec, now)
        decision = decide(spec, status, summary, now, queue)
        try:
            # Status first: until the status pass has recorded this attempt, it is not ours to create.
            if decision.action == Action.CREATE and decision.attempt == int(status.get("attempt", 0)):
                # The namespace's quotas are judged once an attempt, for the whole gang, before its first
                # pod: later passes create the ranks whose names have come free since (the old attempt's
                # pods, still counted until they are gone, are left out of what the quota has used).
                first = None if summary.live_ranks else len(summary.uids)
                await self._create(job, spec, decision.create_ranks, decision.attempt, leaving=first)
            # After the gang's pods: a quota with room for the gang alone holds the gang, not its helpers.
            if keeps_data_workers(next_phase(status, summary, decision, spec), decision.action == Action.QUEUE):
                await self._create_data_workers(job, spec, self._data_workers(job, spec))
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
            validate_job_name(job["metadata"]["name"], spec.world_size, spec.data_worker_replicas)
        except InvalidSpec as error:
            if record_invalid:
                await self._record(job, invalid_spec_status(error, status, now, job["metadata"].get("generation")))
            return None
        return job, spec, status, now

    def _rank_pods(self, job: Mapping[str, Any]) -> list[dict[str, Any]]:
        return [pod for pod in self._own_pods(job) if not is_data_worker(pod)]

    def _data_workers(self, job: Mapping[str, Any], spec: JobSpec) -> DataWorkerSummary:
        return summarize_data_workers([pod for pod in self._own_pods(job) if is_data_worker(pod)],
                                      spec.data_worker_replicas)

    def _own_pods(self, job: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The job's pods by owner, not by label alone: a pod with its labels that it does not control
        (orphaned from a predecessor of the same name, made by hand) is never counted, adopted or
        deleted; where it holds a rank's name, creating that rank says so (NameInUse)."""
        key = (job["metadata"]["namespace"], job["metadata"]["name"])
        return [pod for pod in self.pods.pods(key) if is_controlled_by(pod["metadata"], job)]

    def _summary(self, job: Mapping[str, Any], status: Mapping[str, Any], spec: JobSpec, now: datetime) -> PodSummary:
        key = (job["metadata"]["namespace"], job["metadata"]["name"])
        pods = self._rank_pods(job)
        nodes = self.nodes()
        bound = {pod["spec"]["nodeName"] for pod in pods if pod["spec"].get("nodeName")}
        lost = lost_nodes(bound, nodes, spec.node_lost_grace_seconds, now)
        # In place, a replaced pod keeps a label of the gang's attempts until the watch shows it going.
        replaced = {uid for uid, _ in self._deleting} if spec.in_place else set()
        summary = summarize_pods(pods, int(status.get("attempt", 0)), key[1], lost, spec.ranks_per_pod,
                                 since=pod_attempt_floor(status), replaced=replaced,
                                 process_failures=status.get(api.STATUS_PROCESS_FAILURES),
                                 members=elastic.members(spec, status) if spec.elastic else None)
        memory = self._of(key)
        held = memory.in_the_way.problems(spec.pods, summary.live_ranks)
        if memory.refused is not None:
            held += memory.refused.problems(summary.attempt, summary.live_ranks)
        too_large = self._too_large(job, spec, nodes) if summary.unscheduled_ranks else None
        if too_large:
            held += tuple(RankProblem(rank, c.REASON_GANG_TOO_LARGE, too_large) for rank in summary.unscheduled_ranks)
        return summary.with_problems(held)

    def _too_large(self, job: Mapping[str, Any], spec: JobSpec, nodes: Nodes) -> str | None:
        """gang_too_large, judged again only when the nodes or the job's spec changed: a gang coming up
        has unscheduled ranks for many passes, and a cluster may have thousands of nodes."""
        if not nodes.synced:
            return None
        memory = self._of((job["metadata"]["namespace"], job["metadata"]["name"]))
        generation = job["metadata"].get("generation")
        if memory.fit is not None and memory.fit[0] is nodes.known and memory.fit[1] == generation:
            return memory.fit[2]
        verdict = gang_too_large(spec, nodes.known.values())
        memory.fit = (nodes.known, generation, verdict)
        return verdict

    async def _reconcile(self, job: dict[str, Any], spec: JobSpec, status: Mapping[str, Any], now: datetime) -> float | None:
        name = job["metadata"]["name"]
        queue = self._queue(job, spec, status)
        if queue is not None and queue.gate == Gate.UNKNOWN:  # nothing is done until Kueue's word is known
            return WORKLOADS_UNSYNCED_RECHECK
        summary = self._summary(job, status, spec, now)
        decision = decide(spec, status, summary, now, queue or None)
        log.debug("%s/%s: %s", job["metadata"]["namespace"], name, decision)
        # Status first: if an action below fails, the next pass repeats it from the recorded
        # attempt instead of counting the same restart twice.
        patch = compute_status(spec, status, summary, decision, now, job["metadata"].get("generation"))
        key = (job["metadata"]["namespace"], name)
        workers = self._data_workers(job, spec)
        keep_workers = keeps_data_workers(patch["phase"], decision.action == Action.QUEUE)
        if spec.data_workers is not None:
            refused = self._of(key).data_refused
            patch.update(data_worker_status(name, workers, patch["phase"], keep_workers,
                                            (refused.reason, refused.message) if refused else None,
                                            patch["conditions"], now, job["metadata"].get("generation")))
        wait = self._counts_wait(key, status, patch)
        if wait is None:
            await self._record(job, patch)
        await self._delete(job, decision.delete_pods, summary.uids)
        await self._delete(job, summary.lost_pods, summary.uids, force=True)
        # Data workers outlive gang restarts; they go with the job's end, suspension or queueing.
        await self._delete(job, workers.remove if keep_workers else tuple(workers.uids), workers.uids)
        if keep_workers and workers.missing:
            self.creations.add(key)
        if self.kueue is not None:
            await self.kueue.sync(job, spec, {**status, **patch}, now, has_pods=bool(self._own_pods(job)))
        quota_wait = self._quota_wait(key, decision.attempt) if decision.action == Action.CREATE else None
        if decision.action == Action.CREATE and quota_wait is None:
            # Not awaited here: a pass that waited on pod creation would hold its worker while
            # other jobs' status (a gang that just became Running) waits in the queue.
            self.creations.add(key)
        # Objects in the way are not watched (they are not ours): look again in a while.
        recheck = IN_THE_WAY_RECHECK if self._of(key).in_the_way else None
        if keep_workers and self._of(key).data_refused is not None:
            recheck = min(recheck or DATA_WORKERS_REFUSED_RECHECK, DATA_WORKERS_REFUSED_RECHECK)
        workload_retry = self.kueue.recheck_after(key) if self.kueue is not None else None
        if workload_retry is not None:
            recheck = min(recheck or workload_retry, workload_retry)
        # A node NotReady under a rank is lost once the grace has passed: look again then.
        lost_in = seconds_until_lost(summary.nodes, self.nodes(), spec.node_lost_grace_seconds, now)
        due = [t for t in (wait, recheck, lost_in, quota_wait, decision.recheck_after,
                           requeue_after({**status, **patch}, spec, now)) if t is not None]
        return min(due) if due else None

    def _queue(self, job: Mapping[str, Any], spec: JobSpec, status: Mapping[str, Any]) -> QueueState | None:
        """For a job in a Kueue queue, what its Workload allows (KueueGate.state); None for any other."""
        return self.kueue.state(job, spec, status) if self.kueue is not None else None

    def _quota_wait(self, key: JobKey, attempt: int) -> float | None:
        """Seconds until the next try to create a gang a quota refused; None to try now."""
        known = self._of(key).refused
        if known is None or not known.refusal.waits or known.attempt != attempt:
            return None
        left = known.retry_at - time.monotonic()
        return left if left > 0 else None

    def _counts_wait(self, key: JobKey, status: Mapping[str, Any], patch: Mapping[str, Any]) -> float | None:
        """Seconds to hold back a patch that only moves rank counts; None to patch now."""
        if not only_counts_changed(status, patch):
            return None
        elapsed = time.monotonic() - self._of(key).patched_at
        return COUNTS_INTERVAL - elapsed if elapsed < COUNTS_INTERVAL else None

    async def _create(self, job: dict[str, Any], spec: JobSpec, ranks: tuple[int, ...], attempt: int,
                      leaving: int | None = None) -> None:
        """Creates the job's Service and progress identity, then the ranks' pods: all of them or, when a
        namespace quota could not hold the whole gang, none (an elastic job: those that fit, if at least
        its minimum). `leaving`: for an attempt's first pass, how
        many of the job's older pods still exist (the quotas are judged then, not on later passes). What
        is refused is noted for the status pass (`_note_refused`), which says it and decides; this pass
        writes no status."""
        key = (job["metadata"]["namespace"], job["metadata"]["name"])
        said_before = self._of(key).refused
        # A Kueue-managed job's quota is Kueue's to judge: it admitted the gang as a whole. The quotas
        # are read while the Service and identity are ensured: the read is on the way to the first pods.
        limits = asyncio.ensure_future(self._quota_limits(key[0])) if leaving is not None and queue_name(job) is None \
            else None
        try:
            # In order: a RoleBinding is refused (404) while its Role does not exist yet, unless the
            # caller may bind anything (an admin may; the operator's own ClusterRole may not).
            objects: list[str] = []
            if spec.data_worker_replicas:  # the ranks read the data token from it
                try:
                    await self.kube.create_secret(adopt(build_token_secret(job, secrets.token_hex(32)), job))
                except ApiException as error:
                    self._note_refused(key, attempt, ranks, self._refusal(error), "Secret")
                    return
            for child in (build_service(job, spec), *build_progress_access(job, spec)):
                try:
                    holder = await self.kube.ensure(adopt(child, job))
                except ApiException as error:
                    self._note_refused(key, attempt, ranks, self._refusal(error), child["kind"])
                    return
                if holder is not None and not is_controlled_by(holder, job):
                    objects.append(f"{child['kind']} {child['metadata']['name']}")
            pods: tuple[tuple[int, str], ...] = ()
            if not objects:  # without its Service (or its identity) no rank could start as it should
                created = await self._create_pods(job, spec, ranks, attempt, limits, leaving or 0)
                if created is None:
                    return
                pods = created
        finally:
            if limits is not None and not limits.done():
                limits.cancel()
        memory = self._of(key)
        if memory.refused is not None and memory.refused is said_before:  # nothing refused this pass
            memory.refused = None
            self.add(key)  # the status pass stops saying so
        self._note_in_the_way(key, InTheWay(tuple(objects), pods))

    async def _create_data_workers(self, job: dict[str, Any], spec: JobSpec, workers: DataWorkerSummary) -> None:
        """The missing data workers' pods, with the job's Service (their DNS names) and data token. What
        is refused is kept for the status pass, which says it and tries again in a while."""
        if not workers.missing or spec.data_workers is None:
            return
        key = (job["metadata"]["namespace"], job["metadata"]["name"])
        memory = self._of(key)
        try:
            await self.kube.ensure(adopt(build_service(job, spec), job))
            await self.kube.create_secret(adopt(build_token_secret(job, secrets.token_hex(32)), job))
            results = await asyncio.gather(
                *(self.kube.ensure(adopt(build_data_worker_pod(job, spec, i), job)) for i in workers.missing),
                return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException):
                    raise result
        except ApiException as error:
            refusal = self._refusal(error)
            memory.data_refused = Refusal(refusal.reason, refusal.said_of("data worker pod"))
            log.info("%s/%s: data workers refused (%s): %s", *key, refusal.reason, refusal.message)
            self.add(key)
            return
        if memory.data_refused is not None:
            memory.data_refused = None
            self.add(key)

    async def _create_pods(self, job: dict[str, Any], spec: JobSpec, ranks: tuple[int, ...], attempt: int,
                           limits: asyncio.Future[tuple[list[dict[str, Any]], list[dict[str, Any]]] | None] | None,
                           leaving: int) -> tuple[tuple[int, str], ...] | None:
        """The ranks' pods, after the quotas (`limits`, being read) were judged for the whole gang; the
        ranks whose names strangers hold, or None when something was refused (noted)."""
        key = (job["metadata"]["namespace"], job["metadata"]["name"])
        built = [adopt(build_pod(job, spec, rank, attempt), job) for rank in ranks]
        read = await limits if limits is not None else None
        if read is not None and built:  # every rank's pod asks for what rank 0's does
            quotas, limit_ranges = read
            # An elastic job's ranks that fit are created (they start without the rest once
            # elasticSettleSeconds pass); any other gang is created whole or not at all.
            fits = pods_that_fit(built[0], spec.pods, spec.min_pods, quotas, limit_ranges, [built[0]] * leaving) \
                if spec.elastic else 0
            shortfall = gang_shortfall([built[0]] * spec.pods, quotas, limit_ranges, leaving=[built[0]] * leaving,
                                       created=fits)
            if shortfall is not None:
                left_out = spec.pods - fits if fits else len(ranks)
                self._note_refused(key, attempt, ranks[-left_out:], Refusal(shortfall.reason, shortfall.message))
                if left_out >= len(ranks):
                    return None
                ranks, built = ranks[:-left_out], built[:-left_out]
        results = await asyncio.gather(*(self.kube.ensure(pod) for pod in built), return_exceptions=True)
        refusals: dict[int, Refusal] = {}
        for rank, result in zip(ranks, results, strict=True):
            if isinstance(result, ApiException):
                refusals[rank] = self._refusal(result)
            elif isinstance(result, BaseException):
                raise result
        if refusals:
            first = refusals[min(refusals)]
            self._note_refused(key, attempt, [r for r, said in refusals.items() if said == first], first, "pod")
            return None
        return tuple((rank, pod["metadata"]["name"]) for rank, pod, holder in zip(ranks, built, results, strict=True)
                     if holder is not None and not is_controlled_by(holder, job))  # type: ignore[arg-type]

    @staticmethod
    def _refusal(error: ApiException) -> Refusal:
        """The API server's refusal in `error`; any other error (a conflict, the namespace going away, a
        server error) is raised again, for the work queue to retry or drop as before."""
        refusal = None if is_going_away(error) else classify(error.status, api_message(error))
        if refusal is None:
            raise error
        return refusal

    async def _quota_limits(self, namespace: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
        """The namespace's ResourceQuotas and LimitRanges (none read when there is no quota); None where we
        may not read them (the API server alone judges then, pod by pod)."""
        try:
            quotas = await self.kube.list_objects("ResourceQuota", namespace)
            return quotas, await self.kube.list_objects("LimitRange", namespace) if quotas else []
        except ApiException as error:
            if error.status != 403:
                raise
            if namespace not in self._unreadable_quotas:
                self._unreadable_quotas.add(namespace)
                log.warning("may not list ResourceQuotas or LimitRanges in %s, so a gang is not checked against its "
                            "quotas before its pods are created: %s", namespace, api_message(error))
            return None

    def _note_refused(self, key: JobKey, attempt: int, ranks: Iterable[int], refusal: Refusal, kind: str = "") -> None:
        """Keeps what was refused for the status pass, and asks for one."""
        said = Refusal(refusal.reason, refusal.said_of(kind)) if kind else refusal
        memory, now = self._of(key), time.monotonic()
        memory.refused = memory.refused.again(attempt, ranks, said, now) if memory.refused else refused(attempt, ranks, said, now)
        log.info("%s/%s: creation refused (%s): %s", *key, said.reason, said.message)
        self.add(key)

    def _note_in_the_way(self, key: JobKey, found: InTheWay) -> None:
        memory = self._of(key)
        if found == memory.in_the_way:
            return
        memory.in_the_way = found
        self.add(key)  # the status pass says so (or stops saying so)

    async def _delete(self, job: Mapping[str, Any], names: tuple[str, ...], uids: Mapping[str, str],
                      force: bool = False) -> None:
        """Deletes each named pod (the one with the uid the decision saw), once: the passes that follow
        a gang restart still see pods whose deletion has not reached the pod watch yet. force: at once
        (grace period 0), for pods on a lost node; a pod deleted gracefully before may be forced after."""
        namespace = job["metadata"]["namespace"]
        now = time.monotonic()
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

    async def _record(self, job: dict[str, Any], patch: Mapping[str, Any]) -> None:
        """Patches status when it changed, keeps the answer, and announces a new phase as an Event."""
        status = job.get("status") or {}
        if not changed_fields(status, patch):
            return
        meta = job["metadata"]
        self._of((meta["namespace"], meta["name"])).patched_at = time.monotonic()
        updated = await self.kube.patch_job_status(meta["namespace"], meta["name"], patch)
        self.jobs.put(updated)
        metrics.status_recorded(job, status, patch, datetime.now(UTC))
        for kind, reason, message in events_for(status, patch):
            log.info("%s/%s: %s -> %s (%s) %s", meta["namespace"], meta["name"], status.get("phase"),
                     patch.get("phase"), reason, message)
            await post_event(self.kube, updated, kind, reason, message)
