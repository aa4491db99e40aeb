"""A job's creation pass: the children a decision to create asks for (the Service, the progress
identity, the data token, the ranks' pods, the data workers' pods), created against the API server.

All of them or, when a namespace quota could not hold the whole gang, none of the ranks' pods (an
elastic job: those that fit, if at least its minimum). It writes no status: what it could not create
(a name in the way, a refusal, a quota too small for the gang) is kept in the job's JobMemory and
the status pass, the only writer, says it and decides (reconciler.py).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from kubernetes.client.rest import ApiException

from ddp_contract.jobspec import JobSpec
from ddp_contract.resource import JobKey, job_key
from ddp_operator import constants as c
from ddp_operator import modes
from ddp_operator.admission import Refusal, classify, refused
from ddp_operator.capacity import InTheWay
from ddp_operator.dataworkers import DataWorkerSummary
from ddp_operator.jobmemory import JobMemory
from ddp_operator.kubeapi import KubeApi, adopt, api_message, ensure_each, is_controlled_by, is_going_away
from ddp_operator.kueue.flavors import FlavorMissing
from ddp_operator.kueue.rules import queue_name
from ddp_operator.manifests import (
    build_data_worker_pod,
    build_pod,
    build_progress_access,
    build_service,
    build_token_secret,
    pod_name,
)
from ddp_operator.passerrors import failed_pass_message, is_transient
from ddp_operator.placement import ANYWHERE, NOWHERE, GangPlacement, PlacementConflict, first_of_each_domain, place
from ddp_operator.quota import gang_shortfall, pods_that_fit
from ddp_operator.topology import NoDomain

log = logging.getLogger(__name__)


Placer = Callable[[dict[str, Any], JobSpec], Awaitable[GangPlacement]]


class Creation:
    """Creates a job's children; what it could not is noted in the job's memory, and a status pass asked for.
    placer: where a gang's pods go (Kueue's admission, spec.topology: Reconciler._placement)."""

    def __init__(self, kube: KubeApi, memory: Callable[[JobKey], JobMemory], ask_status_pass: Callable[[JobKey], None],
                 clock: Callable[[], float], placer: Placer | None = None) -> None:
        self.kube = kube
        self.memory = memory
        self.ask_status_pass = ask_status_pass
        self.clock = clock
        self.placer = placer
        self._unreadable_quotas: set[str] = set()  # namespaces whose ResourceQuotas we may not list (said once)

    async def gang(self, job: dict[str, Any], spec: JobSpec, ranks: tuple[int, ...], attempt: int, *,
                   live: int = 0, leaving: int = 0) -> None:
        """`_gang`; where it raises for a cause of the job's own (not the API server's, nor the network's),
        the ranks are held up with reason ReconcileError, said by the status pass and tried again with
        growing pauses, as a quota's refusal is."""
        try:
            await self._gang(job, spec, ranks, attempt, live=live, leaving=leaving)
        except Exception as error:
            if isinstance(error, ApiException) or is_transient(error):
                raise
            self._note_refused(job_key(job), attempt=attempt, ranks=ranks, refusal=self._failed(job_key(job), error))

    async def _gang(self, job: dict[str, Any], spec: JobSpec, ranks: tuple[int, ...], attempt: int, *,
                    live: int = 0, leaving: int = 0) -> None:
        """Creates the job's Service and progress identity, then the ranks' pods: all of them or, when a
        namespace quota could not hold the whole gang, none (an elastic job: those that fit, if at least
        its minimum). `live`: how many of the attempt's ranks have pods already; with none (the attempt's
        first pass) the namespace's quotas are judged for the whole gang, with `leaving` of the job's
        older pods still there, and on an elastic job's later passes for the ranks left out. What is
        refused is noted for the status pass (`_note_refused`), which says it and decides; this pass
        writes no status."""
        key = job_key(job)
        said_before = self.memory(key).refused
        # A Kueue-managed job's quota is Kueue's to judge: it admitted the gang as a whole. The quotas
        # are read while the Service and identity are ensured: the read is on the way to the first pods.
        least = modes.of(spec).least_created  # an elastic gang's: the ranks left out are judged again
        judged = (live == 0 or least is not None) and queue_name(job) is None
        limits = asyncio.ensure_future(self._quota_limits(key[0])) if judged else None
        try:
            # In order: a RoleBinding is refused (404) while its Role does not exist yet, unless the
            # caller may bind anything (an admin may; the operator's own ClusterRole may not).
            objects: list[str] = []
            # The ranks read the job's token from it: for their data workers, and under InPlace to hand
            # their memory snapshots to each other.
            if spec.data_worker_replicas or not modes.of(spec).restart_recreates:
                try:
                    await self.kube.create_secret(adopt(build_token_secret(job, secrets.token_hex(32)), job))
                except ApiException as error:
                    self._note_refused(key, attempt=attempt, ranks=ranks, refusal=self._refusal(error), kind="Secret")
                    return
            for child in (build_service(job, spec), *build_progress_access(job, spec)):
                try:
                    holder = await self.kube.ensure(adopt(child, job))
                except ApiException as error:
                    self._note_refused(key, attempt=attempt, ranks=ranks, refusal=self._refusal(error), kind=child["kind"])
                    return
                if holder is not None and not is_controlled_by(holder, job):
                    objects.append(f"{child['kind']} {child['metadata']['name']}")
            pods: tuple[tuple[int, str], ...] = ()
            if not objects:  # without its Service (or its identity) no rank could start as it should
                try:
                    placement = await self._placement(job, spec)

                    def build(index: int) -> dict[str, Any]:
                        return adopt(place(build_pod(job, spec, index, attempt), placement.ranks, index), job)

                    # Each pod is built when its call is about to go (a gang's 10,000 manifests are never all
                    # in memory at once); what the placement could refuse is found first, with one pod for
                    # each topology domain (place's conflicts depend on the domain alone).
                    for index in first_of_each_domain(placement.ranks, ranks):
                        build(index)
                except (PlacementConflict, FlavorMissing, NoDomain) as error:
                    self._note_refused(key, attempt=attempt, ranks=ranks, refusal=_placement_refusal(error))
                    return
                created = await self._pods(job, spec, build, ranks=ranks, attempt=attempt, limits=limits, live=live,
                                           leaving=leaving, least=least)
                if created is None:
                    return
                pods = created
        finally:
            if limits is not None and not limits.done():
                limits.cancel()
        memory = self.memory(key)
        if memory.refused is not None and memory.refused is said_before:  # nothing refused this pass
            memory.refused = None
            self.ask_status_pass(key)  # the status pass stops saying so
        self._note_in_the_way(key, InTheWay(tuple(objects), pods))


    async def data_workers(self, job: dict[str, Any], spec: JobSpec, workers: DataWorkerSummary) -> None:
        """The missing data workers' pods, with the job's Service (their DNS names) and data token. What
        is refused is kept for the status pass, which says it and tries again in a while."""
        if not workers.missing or spec.data_workers is None:
            return
        key = job_key(job)
        memory = self.memory(key)
        try:
            await self._data_workers(job, spec, workers)
        except ApiException as error:
            refusal = self._refusal(error)
            memory.data_refused = Refusal(refusal.reason, refusal.said_of("data worker pod"))
            log.info("%s/%s: data workers refused (%s): %s", *key, refusal.reason, refusal.message)
            self.ask_status_pass(key)
            return
        except (PlacementConflict, FlavorMissing, NoDomain) as error:
            memory.data_refused = _placement_refusal(error)
            self.ask_status_pass(key)
            return
        except Exception as error:
            if is_transient(error):
                raise
            memory.data_refused = self._failed(key, error)
            self.ask_status_pass(key)
            return
        if memory.data_refused is not None:
            memory.data_refused = None
            self.ask_status_pass(key)

    async def _data_workers(self, job: dict[str, Any], spec: JobSpec, workers: DataWorkerSummary) -> None:
        # Kueue's admission places them; spec.topology places the ranks only.
        placement = (await self._placement(job, spec)).data_workers if queue_name(job) else NOWHERE
        built = [adopt(place(build_data_worker_pod(job, spec, i), placement, i), job) for i in workers.missing]
        await self.kube.ensure(adopt(build_service(job, spec), job))
        await self.kube.create_secret(adopt(build_token_secret(job, secrets.token_hex(32)), job))
        results = await asyncio.gather(*(self.kube.ensure(pod) for pod in built), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result


    async def _pods(self, job: dict[str, Any], spec: JobSpec, build: Callable[[int], dict[str, Any]], *,
                    ranks: tuple[int, ...], attempt: int,
                    limits: asyncio.Future[tuple[list[dict[str, Any]], list[dict[str, Any]]] | None] | None,
                    live: int, leaving: int, least: int | None) -> tuple[tuple[int, str], ...] | None:
        """The ranks' pods (`build(rank)` makes each), after the quotas (`limits`, being read) were judged
        for them; the ranks whose names strangers hold, or None when something was refused (noted).
        least: the fewest of the gang's pods that may be created without the rest (Mode.least_created)."""
        key = job_key(job)
        read = await limits if limits is not None else None
        if read is not None and ranks:  # every rank's pod asks for what the first one's does
            model = build(ranks[0])
            quotas, limit_ranges = read
            if live:
                # An elastic job's ranks left out: those that fit now join the live ones (judged here so
                # that the job keeps saying which quota holds them, not the API server's refusal).
                fits = pods_that_fit(model, quotas, most=len(ranks), least=1, limit_ranges=limit_ranges)
                shortfall = None if fits == len(ranks) else gang_shortfall(
                    [model] * len(ranks), quotas, limit_ranges=limit_ranges, created=live + fits, rest=True)
                left_out = len(ranks) - fits
            else:
                # An elastic job's ranks that fit are created (they start without the rest once
                # elasticSettleSeconds pass); any other gang is created whole or not at all.
                fits = pods_that_fit(model, quotas, most=spec.all_pods, least=least,
                                     limit_ranges=limit_ranges, leaving=[model] * leaving) if least is not None else 0
                shortfall = gang_shortfall([model] * spec.all_pods, quotas, limit_ranges=limit_ranges,
                                           leaving=[model] * leaving, created=fits)
                left_out = spec.all_pods - fits if fits else len(ranks)
            if shortfall is not None:
                self._note_refused(key, attempt=attempt, ranks=ranks[-left_out:],
                                   refusal=Refusal(shortfall.reason, shortfall.message))
                if left_out >= len(ranks):
                    return None
                ranks = ranks[:-left_out]
        results = await ensure_each(self.kube.ensure, ranks, build)
        refusals: dict[int, Refusal] = {}
        for rank, result in zip(ranks, results, strict=True):
            if isinstance(result, ApiException):
                refusals[rank] = self._refusal(result)
            elif isinstance(result, BaseException):
                raise result
        if refusals:
            first = refusals[min(refusals)]
            self._note_refused(key, attempt=attempt, ranks=[r for r, said in refusals.items() if said == first], refusal=first,
                               kind="pod")
            return None
        now = self.clock()
        self.memory(key).unseen.update(((pod_name(key[1], rank), attempt), now)
                                       for rank, holder in zip(ranks, results, strict=True) if holder is None)
        return tuple((rank, pod_name(key[1], rank)) for rank, holder in zip(ranks, results, strict=True)
                     if holder is not None and not is_controlled_by(holder, job))  # type: ignore[arg-type]

    async def _placement(self, job: dict[str, Any], spec: JobSpec) -> GangPlacement:
        return await self.placer(job, spec) if self.placer is not None else ANYWHERE

    def _failed(self, key: JobKey, error: Exception) -> Refusal:
        """A creation that raised for a cause of the job's own, as a refusal the status pass says
        (ReconcileError); the traceback is logged the first time its words come up for the job."""
        message = failed_pass_message(error, "creation pass")
        said = self.memory(key).failures_said
        if message not in said:
            said.add(message)
            log.error("%s/%s: %s", *key, message, exc_info=error)
        return Refusal(c.REASON_RECONCILE_ERROR, message)

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


    def _note_refused(self, key: JobKey, *, attempt: int, ranks: Iterable[int], refusal: Refusal, kind: str = "") -> None:
        """Keeps what was refused for the status pass, and asks for one."""
        said = Refusal(refusal.reason, refusal.said_of(kind)) if kind else refusal
        memory, now = self.memory(key), self.clock()
        memory.refused = (memory.refused.again(attempt, ranks, said, now) if memory.refused
                          else refused(attempt, ranks, refusal=said, now=now))
        log.info("%s/%s: creation refused (%s): %s", *key, said.reason, said.message)
        self.ask_status_pass(key)


    def _note_in_the_way(self, key: JobKey, found: InTheWay) -> None:
        memory = self.memory(key)
        if found == memory.in_the_way:
            return
        memory.in_the_way = found
        self.ask_status_pass(key)  # the status pass says so (or stops saying so)


def _placement_refusal(error: PlacementConflict | FlavorMissing | NoDomain) -> Refusal:
    """A conflict fails the job (Kueue marks its own kinds' Workloads failed to start); a gang that no
    topology domain holds now, and a ResourceFlavor that cannot be read, are tried again with growing pauses."""
    if isinstance(error, PlacementConflict):
        return Refusal(c.REASON_PLACEMENT_CONFLICT, f"the pods cannot be placed where they were admitted: {error}")
    if isinstance(error, NoDomain):
        return Refusal(c.REASON_NO_TOPOLOGY_DOMAIN, str(error))
    return Refusal(c.REASON_RECONCILE_ERROR, str(error))
