"""The calls the reconciler makes of the Kubernetes API (ddp_operator.kubeapi.KubeApi), answered from
dicts, for unit tests of what a pass does: every create, delete, status patch and Event in order,
refusals primed by kind and name. The cluster tests check the same against a real API server."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterable, Mapping
from types import SimpleNamespace
from typing import Any

from kubernetes.client.rest import ApiException

from ddp_contract import labels
from ddp_operator.kubeapi import owner_reference
from ddp_operator.listwatch import JobKey
from ddp_operator.nodes import Nodes
from ddp_operator.reconciler import JobStore, Reconciler
from podfixtures import JOB

NAMESPACE = "team"
KEY: JobKey = (NAMESPACE, JOB)


def refusal(status: int, message: str) -> ApiException:
    """An API error as the client raises it: the server's Status in the body."""
    error = ApiException(status=status, reason="Forbidden")
    error.body = json.dumps({"kind": "Status", "message": message})
    return error


def merged(current: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON merge patch (RFC 7386): None removes a field, objects merge, anything else replaces."""
    out = dict(current)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


class FakeKube:
    def __init__(self, jobs: JobStore) -> None:
        self.jobs = jobs
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}  # (kind, name) -> what was created
        self.calls: list[tuple[Any, ...]] = []  # ("create", kind, name), ("delete", name, uid, force), ...
        self.refuse: dict[tuple[str, str], ApiException] = {}  # (kind, name) -> raised by its create
        self.quotas: list[dict[str, Any]] = []
        self.limit_ranges: list[dict[str, Any]] = []
        self.status_patches: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.core = SimpleNamespace(create_namespaced_event=lambda namespace, event: self.events.append(event))
        self.workload_patches: list[tuple[str, dict[str, Any], bool]] = []  # (name, patch, of its status)
        self.custom = SimpleNamespace(
            patch_namespaced_custom_object=lambda group, version, namespace, plural, name, body:
                self.workload_patches.append((name, body, False)),
            patch_namespaced_custom_object_status=lambda group, version, namespace, plural, name, body:
                self.workload_patches.append((name, body, True)))

    def created(self, kind: str) -> list[str]:
        return [call[2] for call in self.calls if call[:2] == ("create", kind)]

    def deleted(self) -> list[tuple[str, str, bool]]:
        return [call[1:] for call in self.calls if call[0] == "delete"]

    async def ensure(self, obj: dict[str, Any], calls: Any = None) -> Mapping[str, Any] | None:
        kind, name = obj["kind"], obj["metadata"]["name"]
        if (kind, name) in self.refuse:
            raise self.refuse[(kind, name)]
        if (kind, name) in self.objects:
            return self.objects[(kind, name)]["metadata"]
        kept = copy.deepcopy(obj)
        kept["metadata"]["uid"] = f"uid-{kind}-{name}"
        self.objects[(kind, name)] = kept
        self.calls.append(("create", kind, name))
        return None

    async def create_secret(self, obj: dict[str, Any]) -> bool:
        return await self.ensure({**obj, "kind": "Secret"}) is None

    async def delete_pod(self, namespace: str, name: str, uid: str, force: bool = False) -> None:
        self.calls.append(("delete", name, uid, force))

    async def delete_job(self, namespace: str, name: str) -> None:
        self.calls.append(("delete-job", name))

    async def list_objects(self, kind: str, namespace: str) -> list[dict[str, Any]]:
        self.calls.append(("list", kind))
        return copy.deepcopy(self.quotas if kind == "ResourceQuota" else self.limit_ranges)

    async def patch_job_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> dict[str, Any]:
        job = self.jobs.get((namespace, name))
        assert job is not None, f"status patched for {namespace}/{name}, which the store does not hold"
        self.status_patches.append(dict(status))
        version = int(job["metadata"].get("resourceVersion") or 0) + 1
        return {**job, "metadata": {**job["metadata"], "resourceVersion": str(version)},
                "status": merged(job.get("status") or {}, status)}

    async def send(self, fn: Callable[..., Any], *args: Any, status: bool = False, **kwargs: Any) -> None:
        fn(*args, **kwargs)

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)


class FakePods:
    """The pod watch's view (podwatch.PodCache.pods) of one job, set by the test."""

    def __init__(self) -> None:
        self.by_job: dict[JobKey, list[dict[str, Any]]] = {}

    def pods(self, key: JobKey) -> list[dict[str, Any]]:
        return self.by_job.get(key, [])

    def every_object(self) -> list[dict[str, Any]]:
        return [pod for pods in self.by_job.values() for pod in pods]

    def set(self, job: Mapping[str, Any], pods: Iterable[dict[str, Any]]) -> None:
        """The job's pods, each made the job's own (its controller owner reference)."""
        owned = []
        for pod in pods:
            pod = copy.deepcopy(pod)
            pod["metadata"]["ownerReferences"] = [owner_reference(job)]
            pod["metadata"].setdefault("namespace", NAMESPACE)
            owned.append(pod)
        self.by_job[KEY] = owned


class FakeWorkloads:
    """The Workload watch's view (kueue.workloads.WorkloadCache) of the job's namespace: listed, holding
    what the test sets."""

    def __init__(self) -> None:
        self.by_job: dict[JobKey, list[dict[str, Any]]] = {}

    def ensure_started(self) -> None:
        pass

    def workloads(self, key: JobKey) -> list[dict[str, Any]]:
        return self.by_job.get(key, [])

    def synced_in(self, namespace: str) -> bool:
        return True

    def unavailable(self, namespace: str) -> str | None:
        return None

    def error_in(self, namespace: str) -> None:
        return None


def ddpjob(status: Mapping[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "ddpoperator.io/v1alpha1", "kind": "DDPJob",
            "metadata": {"name": JOB, "namespace": NAMESPACE, "uid": "job-uid", "generation": 1, "resourceVersion": "1",
                         "labels": {}},
            "spec": {"worldSize": 2, "gpusPerRank": 0, "image": "trainer:1", "entrypoint": "train:main", **spec},
            "status": dict(status or {})}


def reconciler_for(job: Mapping[str, Any], workloads: FakeWorkloads | None = None
                   ) -> tuple[Reconciler, FakeKube, FakePods]:
    """A reconciler whose store holds `job`, on a fake API, fake pods and synced nodes (none); with
    `workloads`, Kueue's Workloads as they say."""
    store = JobStore()
    store.put(job)
    kube, pods = FakeKube(store), FakePods()
    reconciler = Reconciler(kube, jobs=store, pods=pods, nodes=lambda: Nodes(synced=True), workers=1,  # type: ignore[arg-type]
                            workloads=workloads)  # type: ignore[arg-type]
    return reconciler, kube, pods


def rank_of(pod: Mapping[str, Any]) -> int:
    return int(pod["metadata"]["labels"][labels.LABEL_RANK])
