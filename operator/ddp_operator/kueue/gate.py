"""The reconciler's dealings with Kueue, for the jobs that name a LocalQueue: what the job's Workload
allows its gang now (`state`), and the Workload's part of a status pass (`sync`): create it, deactivate
it while the job is suspended, hand the quota back once an evicted gang's pods are gone, and mark it
Finished with the job. The Workload API calls are made here, on the operator's KubeApi pools.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from ddp_contract import api
from ddp_contract.jobspec import JobSpec
from ddp_contract.jobstatus import STATUS_MESSAGE, STATUS_PHASE, STATUS_START_TIME
from ddp_contract.resource import JobStatus, job_key
from ddp_operator import constants as c
from ddp_operator.kubeapi import KubeApi, adopt, api_message
from ddp_operator.kueue.flavors import (
    PREFERRED_TOPOLOGY_ANNOTATION,
    REQUIRED_TOPOLOGY_ANNOTATION,
    FlavorMissing,
    assigned_flavors,
    placement_of,
)
from ddp_operator.kueue.multikueue import NEEDS_A_QUEUE
from ddp_operator.kueue.rules import (
    DATA_WORKER_POD_SET,
    KUEUE_GROUP,
    KUEUE_VERSION,
    POD_SET,
    PRIORITY_CLASS_LABEL,
    PRIORITY_CLASSES,
    RESOURCE_FLAVORS,
    UNKNOWN,
    WORKLOADS,
    QueueState,
    activation_patch,
    adoption_patch,
    belongs_to,
    build_workload,
    can_judge,
    finish_patch,
    prebuilt_workload,
    priority_class,
    queue_name,
    queue_state,
    release_patch,
)
from ddp_operator.kueue.workloads import WorkloadCache
from ddp_operator.listwatch import JobKey
from ddp_operator.manifests import build_data_worker_pod, build_pod
from ddp_operator.placement import ANYWHERE, GangPlacement

# Seconds between tries to create a Workload the API refused (a missing WorkloadPriorityClass).
WORKLOAD_RETRY = 10.0


class KueueGate:
    def __init__(self, kube: KubeApi, workloads: WorkloadCache) -> None:
        self.kube = kube
        self.workloads = workloads
        self._problems: dict[JobKey, str] = {}  # why a job's Workload could not be created

    def forget(self, key: JobKey) -> None:
        self._problems.pop(key, None)

    def state(self, job: Mapping[str, Any], spec: JobSpec, status: Mapping[str, Any]) -> QueueState | None:
        """What the job's Workload allows: None for a job in no queue (or a finished one); UNKNOWN while
        the Workload watch has not listed the job's namespace, so that a running gang is not judged (and
        stopped) on a view that is merely empty."""
        if queue_name(job) is None:
            multikueue = spec.managed_by == api.MANAGED_BY_MULTIKUEUE
            return NEEDS_A_QUEUE if multikueue and status.get(STATUS_PHASE) not in c.TERMINAL_PHASES else None
        self.workloads.ensure_started()  # a finished job's Workload is still to be marked Finished
        if status.get(STATUS_PHASE) in c.TERMINAL_PHASES:
            return None
        key = job_key(job)
        unavailable = self.workloads.unavailable(key[0])
        error = self.workloads.error_in(key[0])
        if not can_judge(unavailable, error.status if error is not None else None, STATUS_START_TIME in status):
            return UNKNOWN
        return queue_state(job, spec, self._workload(job), unavailable or self._problems.get(key))

    def recheck_after(self, key: JobKey) -> float | None:
        """Seconds until the job's Workload is to be created again, after the API refused it."""
        return WORKLOAD_RETRY if key in self._problems else None

    async def sync(self, job: dict[str, Any], spec: JobSpec, *, status: Mapping[str, Any], now: datetime,
                   has_pods: bool) -> None:
        """The Workload's part of a status pass, for a job in a queue once the namespace's Workloads are
        listed: `status` is the job's as just decided, `has_pods` whether any of its pods still exists."""
        key = job_key(job)
        if queue_name(job) is None or not self.workloads.synced_in(key[0]):
            return
        workload = self._workload(job)
        phase = status.get(STATUS_PHASE)
        try:
            if workload and prebuilt_workload(job) and (adoption := adoption_patch(workload, job)):
                await self.kube.send(self.kube.custom.patch_namespaced_custom_object, KUEUE_GROUP, KUEUE_VERSION,
                                     key[0], WORKLOADS, workload["metadata"]["name"], adoption)
            if phase in c.TERMINAL_PHASES:
                patch = workload and finish_patch(workload, phase == c.PHASE_SUCCEEDED, str(status.get(STATUS_MESSAGE, "")),
                                                  now)
            elif workload is None:
                if not prebuilt_workload(job):  # a prebuilt one is made by whoever named it
                    await self._create(job, spec, JobStatus.of(status).attempt)
                return
            else:
                active = activation_patch(workload, spec)
                if active:
                    await self.kube.send(self.kube.custom.patch_namespaced_custom_object, KUEUE_GROUP, KUEUE_VERSION,
                                         key[0], WORKLOADS, workload["metadata"]["name"], active)
                patch = None if has_pods else release_patch(workload, now)
            if workload and patch:
                await self.kube.send(self.kube.custom.patch_namespaced_custom_object_status, KUEUE_GROUP, KUEUE_VERSION,
                                     key[0], WORKLOADS, workload["metadata"]["name"], patch, status=True)
        except ApiException as error:
            if error.status in (404, 409):  # gone, or changed since it was read: the next pass sees it
                return
            if error.status not in (400, 403, 422):
                raise
            self._problems[key] = f"its Workload was refused: {api_message(error)}"

    def _workload(self, job: Mapping[str, Any]) -> dict[str, Any] | None:
        key = job_key(job)
        return next((w for w in self.workloads.workloads(key) if belongs_to(w, job)), None)

    async def _create(self, job: dict[str, Any], spec: JobSpec, attempt: int) -> None:
        key = job_key(job)
        priority = None
        name = priority_class(job)
        if name:
            priority = await self._priority(name)
            if priority is None:
                self._problems[key] = (f"WorkloadPriorityClass {name} (label {PRIORITY_CLASS_LABEL}) does not "
                                       "exist: create it or change the label")
                return
        pod_spec = build_pod(job, spec, 0, attempt)["spec"]
        workers = build_data_worker_pod(job, spec, 0)["spec"] if spec.data_worker_replicas else None
        custom = self.kube.custom
        workload = build_workload(job, spec, pod_spec=pod_spec, priority=priority, data_worker_pod_spec=workers)
        await self.kube.ensure(adopt(workload, job),
                               calls=(functools.partial(_create_workload, custom), functools.partial(_read_workload, custom)))
        self._problems.pop(key, None)

    async def placement(self, job: Mapping[str, Any], spec: JobSpec) -> GangPlacement:
        """Where the admission of the job's Workload puts its pods (placement.py); ANYWHERE for a job in no
        queue or not admitted. Raises FlavorMissing when an assigned ResourceFlavor cannot be read, and
        PlacementConflict when what admission asks contradicts the pods' own template."""
        workload = self._workload(job) if queue_name(job) is not None else None
        if workload is None:
            return ANYWHERE
        flavors = {}
        for name in assigned_flavors(workload):
            try:
                flavors[name] = await self.kube.call(self.kube.custom.get_cluster_custom_object, KUEUE_GROUP,
                                                     KUEUE_VERSION, RESOURCE_FLAVORS, name)
            except ApiException as error:
                if error.status not in (403, 404):
                    raise
                raise FlavorMissing(f"the ResourceFlavor {name} that Kueue assigned to the job cannot be read: "
                                    f"{api_message(error)}") from None
        request = None
        if spec.topology is not None:
            annotation = REQUIRED_TOPOLOGY_ANNOTATION if spec.topology.required else PREFERRED_TOPOLOGY_ANNOTATION
            request = (annotation, spec.topology.key)
        return GangPlacement(ranks=placement_of(workload, POD_SET, flavors, spec.all_pods, request),
                             data_workers=placement_of(workload, DATA_WORKER_POD_SET, flavors, spec.data_worker_replicas))

    async def _priority(self, name: str) -> int | None:
        """The value of the WorkloadPriorityClass `name`; None if there is none."""
        try:
            found = await self.kube.call(self.kube.custom.get_cluster_custom_object, KUEUE_GROUP, KUEUE_VERSION,
                                         PRIORITY_CLASSES, name)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return int(found.get("value", 0))


def _create_workload(custom: client.CustomObjectsApi, namespace: str, body: Mapping[str, Any], **kwargs: Any) -> Any:
    return custom.create_namespaced_custom_object(KUEUE_GROUP, KUEUE_VERSION, namespace, WORKLOADS, body, **kwargs)


def _read_workload(custom: client.CustomObjectsApi, name: str, namespace: str, **kwargs: Any) -> Any:
    return custom.get_namespaced_custom_object(KUEUE_GROUP, KUEUE_VERSION, namespace, WORKLOADS, name, **kwargs)
