"""The operator's view of its own pods: a label-selected list+watch kept in memory (one per namespace
when the operator watches a list of namespaces). `JobObjects` is that design for any kind of a job's
children; the Kueue Workloads' cache (workloadwatch.py) is the other.

kopf watches every object of a kind and filters labels on the client, so a busy cluster's pods
would all stream through the operator. This watch asks the API server for our pods only
(the job-name label selector), and keeps a slim copy of each, grouped by job.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from ddp_contract.labels import LABEL_JOB_NAME
from ddp_operator.config import exact, served
from ddp_operator.listwatch import ListWatch

JobKey = tuple[str, str]  # (namespace, job name)
OnChange = Callable[[JobKey], None]


def slim_pod(pod: dict) -> dict:
    """The fields the status computation reads, in the pod's own shape."""
    meta = pod.get("metadata", {})
    status = pod.get("status", {})
    return {
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
            "labels": meta.get("labels", {}),
            "deletionTimestamp": meta.get("deletionTimestamp"),
            "ownerReferences": [{"uid": ref.get("uid"), "controller": ref.get("controller")}
                                for ref in meta.get("ownerReferences") or [] if ref.get("controller")],
        },
        # imagePullSecrets: a failed pull names what it was tried with (podsummary.pull_secrets_note).
        "spec": {"nodeName": pod.get("spec", {}).get("nodeName"),
                 "imagePullSecrets": pod.get("spec", {}).get("imagePullSecrets") or []},
        "status": {
            "phase": status.get("phase"),
            "reason": status.get("reason"),
            "message": status.get("message"),
            "startTime": status.get("startTime"),
            "conditions": [
                {"type": c.get("type"), "status": c.get("status"), "reason": c.get("reason"), "message": c.get("message")}
                for c in status.get("conditions", [])
            ],
            "containerStatuses": [
                {"name": c.get("name"), "ready": c.get("ready"), "restartCount": c.get("restartCount"),
                 "state": c.get("state", {})}
                for c in status.get("containerStatuses", [])
            ],
        },
    }


def job_key(obj: dict) -> JobKey | None:
    """(namespace, job name) of one of a job's children, by its job-name label."""
    meta = obj.get("metadata", {})
    job = meta.get("labels", {}).get(LABEL_JOB_NAME)
    return (meta.get("namespace"), job) if job else None


def watch_scopes(namespaces: tuple[str, ...]) -> tuple[tuple[str | None, ...], tuple[str, ...]]:
    """(the namespaces to list and watch, each apart; None: the whole cluster) and the globs a cluster-wide
    watch's objects must match to be kept (empty: all). Exact names get a watch each, so the operator needs
    only a Role in each; a glob or no namespace at all needs one cluster-wide watch."""
    patterns = () if exact(namespaces) else namespaces
    return (namespaces if namespaces and not patterns else (None,)), patterns


class JobObjects(ABC):
    """One kind of a job's children, kept slim by job (the job-name label) and name, fed by one
    list+watch per namespace watched when they are named exactly, else one for the whole cluster,
    keeping the objects of the namespaces that match (namespaces empty: all of them); every change is
    news for its job."""

    def __init__(self, what: str, on_change: OnChange, watch_timeout: int = 300,
                 namespaces: tuple[str, ...] = ()) -> None:
        self._on_change = on_change
        self._lock = threading.Lock()
        self._by_job: dict[JobKey, dict[str, dict]] = {}
        scopes, self._patterns = watch_scopes(namespaces)
        self._watches = [ScopeListWatch(self, what, namespace, watch_timeout) for namespace in scopes]

    @abstractmethod
    def _slim(self, obj: dict[str, Any]) -> dict[str, Any]:
        """What is kept of one object."""

    @abstractmethod
    def list_call(self, namespace: str | None, **kwargs: Any) -> Any:
        """The label-selected list (or, with watch=True, watch) call for one namespace (None: every one)."""

    def _wanted(self, key: JobKey) -> bool:
        return served(key[0], self._patterns)

    def start(self) -> None:
        for watch in self._watches:
            watch.start()

    def stop(self) -> None:
        for watch in self._watches:
            watch.stop()

    @property
    def stopping(self) -> bool:
        return any(watch.stopping for watch in self._watches)

    def _watch_of(self, namespace: str) -> ScopeListWatch:
        """The watch that sees the namespace's objects."""
        return next((w for w in self._watches if w.namespace in (None, namespace)), self._watches[0])

    def synced_in(self, namespace: str) -> bool:
        """Whether the watch that sees the namespace has listed once."""
        return self._watch_of(namespace).synced.is_set()

    def error_in(self, namespace: str) -> ApiException | None:
        """The last failure of the watch that sees the namespace, until it lists again."""
        return self._watch_of(namespace).last_error

    def wait_synced(self, timeout: float) -> bool:
        """Whether every watch has listed once, waiting up to timeout seconds in all."""
        deadline = time.monotonic() + timeout
        return all(watch.synced.wait(max(0.0, deadline - time.monotonic())) for watch in self._watches)

    def objects(self, key: JobKey) -> list[dict]:
        with self._lock:
            return list(self._by_job.get(key, {}).values())

    def jobs_with(self, wanted: Callable[[dict], bool]) -> set[JobKey]:
        """The jobs that have an object for which wanted(obj) is true."""
        with self._lock:
            return {key for key, objs in self._by_job.items() if any(wanted(obj) for obj in objs.values())}

    def replace(self, namespace: str | None, items: list[dict[str, Any]]) -> None:
        """Keeps a fresh list of the namespace's objects (None: every namespace's)."""
        fresh: dict[JobKey, dict[str, dict]] = {}
        for obj in items:
            key = job_key(obj)
            if key and self._wanted(key):
                fresh.setdefault(key, {})[obj["metadata"]["name"]] = self._slim(obj)
        with self._lock:
            kept = {key: objs for key, objs in self._by_job.items() if namespace is not None and key[0] != namespace}
            changed = (set(self._by_job) - set(kept)) | set(fresh)
            self._by_job = {**kept, **fresh}
        self._notify(changed)

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        key = job_key(obj)
        if key is None or not self._wanted(key):
            return
        name = obj["metadata"]["name"]
        with self._lock:
            objs = self._by_job.setdefault(key, {})
            if kind == "DELETED":
                objs.pop(name, None)
                if not objs:
                    del self._by_job[key]
            else:
                objs[name] = self._slim(obj)
        self._notify([key])

    def _notify(self, keys: Iterable[JobKey]) -> None:
        for key in keys:
            if self.stopping:  # the operator is stopping: its event loop may be closed
                return
            self._on_change(key)


class ScopeListWatch(ListWatch):
    """The list+watch of one namespace (None: all of them) feeding a JobObjects cache."""

    def __init__(self, cache: JobObjects, what: str, namespace: str | None, watch_timeout: int) -> None:
        super().__init__(f"{what} ({namespace})" if namespace else what, watch_timeout)
        self._cache = cache
        self.namespace = namespace

    def _call(self, **kwargs: Any) -> Any:
        return self._cache.list_call(self.namespace, **kwargs)

    def _replace(self, items: list[dict[str, Any]]) -> None:
        self._cache.replace(self.namespace, items)

    def _apply(self, kind: str, obj: dict[str, Any]) -> None:
        self._cache.apply(kind, obj)


class PodCache(JobObjects):
    """Our pods (by the job-name label)."""

    def __init__(self, api: client.ApiClient, on_change: OnChange, watch_timeout: int = 300,
                 namespaces: tuple[str, ...] = ()) -> None:
        super().__init__("pod", on_change, watch_timeout, namespaces)
        self._core = client.CoreV1Api(api)

    def pods(self, key: JobKey) -> list[dict]:
        return self.objects(key)

    def _slim(self, obj: dict[str, Any]) -> dict[str, Any]:
        return slim_pod(obj)

    def list_call(self, namespace: str | None, **kwargs: Any) -> Any:
        if namespace is None:
            return self._core.list_pod_for_all_namespaces(label_selector=LABEL_JOB_NAME, **kwargs)
        return self._core.list_namespaced_pod(namespace, label_selector=LABEL_JOB_NAME, **kwargs)
