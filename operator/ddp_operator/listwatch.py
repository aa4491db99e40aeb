"""A list, then a watch from the list's resourceVersion, on a thread of its own: the loop under the
operator's pod, node and Workload caches. Any break (410 Gone, a dropped connection) lists again.

`JobObjects` keeps one kind of a job's children (pods, Kueue Workloads) by job, fed by one such
loop per namespace served (`ScopeListWatch`), and tells the reconciler which job changed.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any

from kubernetes.client.rest import ApiException
from kubernetes.watch.watch import iter_resp_lines

from ddp_contract.labels import LABEL_JOB_NAME
from ddp_contract.resource import JobKey
from ddp_operator.config import exact, served
from ddp_operator.heap import Shrinkage, release_memory

OnChange = Callable[[JobKey], None]

log = logging.getLogger(__name__)
FORBIDDEN_RETRY = 60.0
# A resource not served (404: its CRD not installed yet) is looked for again this often.
NOT_SERVED_RETRY = 5.0


class ListWatch(ABC):
    """Subclasses say how to list (`_call`, with or without watch=True) and what to keep of each
    object (`_replace` for a whole list, `_apply` for one watch event)."""

    def __init__(self, what: str, watch_timeout: int = 300) -> None:
        self._what = what
        self._watch_timeout = watch_timeout
        self.synced = threading.Event()
        self.last_error: ApiException | None = None  # the last failure of the list or watch, until a list succeeds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @abstractmethod
    def _call(self, **kwargs: Any) -> Any:
        """The list call (unparsed: _preload_content=False), made with the given arguments."""

    @abstractmethod
    def _replace(self, items: list[dict[str, Any]]) -> None:
        """Keeps a fresh list, replacing whatever was kept."""

    @abstractmethod
    def _apply(self, kind: str, obj: dict[str, Any]) -> None:
        """Keeps one ADDED, MODIFIED or DELETED object."""

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"{self._what}-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                version = self._relist()
                while not self._stop.is_set():
                    version = self._watch(version)
            except ApiException as error:
                if error.status != 410:  # 410 Gone: the resource version expired; relist
                    self.last_error = error
                    log.warning("%s watch failed (%s); relisting", self._what, error.reason)
                    # Forbidden (a ClusterRole from an older chart) will not pass by itself soon.
                    self._stop.wait({403: FORBIDDEN_RETRY, 404: NOT_SERVED_RETRY}.get(error.status, 1.0))
            except Exception:  # a dropped connection must not end the watch for good
                log.exception("%s watch broke; relisting", self._what)
                self._stop.wait(1.0)

    def _relist(self) -> str:
        listing = json.loads(self._call(_preload_content=False).data)
        self._replace(listing.get("items", []))
        self.last_error = None
        self.synced.set()
        return str(listing["metadata"]["resourceVersion"])

    def _watch(self, version: str) -> str:
        response = self._call(watch=True, allow_watch_bookmarks=True, resource_version=version,
                              timeout_seconds=self._watch_timeout, _preload_content=False)
        try:
            for line in iter_resp_lines(response):
                event = json.loads(line)
                kind, obj = event["type"], event["object"]
                if kind == "ERROR":
                    raise ApiException(status=obj.get("code", 500), reason=obj.get("message"))
                version = obj.get("metadata", {}).get("resourceVersion", version)
                if kind != "BOOKMARK":
                    self._apply(kind, obj)
                if self._stop.is_set():
                    break
        finally:
            response.release_conn()
        return version


def owning_job_key(obj: dict) -> JobKey | None:
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
        self._count = 0  # objects held, every job's
        self._shrinkage = Shrinkage()
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

    def every_object(self) -> list[dict]:
        """Every job's objects."""
        with self._lock:
            return [obj for objs in self._by_job.values() for obj in objs.values()]

    def jobs_with(self, wanted: Callable[[dict], bool]) -> set[JobKey]:
        """The jobs that have an object for which wanted(obj) is true."""
        with self._lock:
            return {key for key, objs in self._by_job.items() if any(wanted(obj) for obj in objs.values())}

    def replace(self, namespace: str | None, items: list[dict[str, Any]]) -> None:
        """Keeps a fresh list of the namespace's objects (None: every namespace's)."""
        fresh: dict[JobKey, dict[str, dict]] = {}
        for obj in items:
            key = owning_job_key(obj)
            if key and self._wanted(key):
                fresh.setdefault(key, {})[obj["metadata"]["name"]] = self._slim(obj)
        with self._lock:
            kept = {key: objs for key, objs in self._by_job.items() if namespace is not None and key[0] != namespace}
            changed = (set(self._by_job) - set(kept)) | set(fresh)
            self._by_job = {**kept, **fresh}
            self._count = sum(len(objs) for objs in self._by_job.values())
        self._notify(changed)
        self._release_if_shrunk()

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        key = owning_job_key(obj)
        if key is None or not self._wanted(key):
            return
        name = obj["metadata"]["name"]
        with self._lock:
            objs = self._by_job.setdefault(key, {})
            if kind == "DELETED":
                self._count -= objs.pop(name, None) is not None
                if not objs:
                    del self._by_job[key]
            else:
                self._count += name not in objs
                objs[name] = self._slim(obj)
        self._notify([key])
        self._release_if_shrunk()

    def _release_if_shrunk(self) -> None:
        """Hands memory back once the cache has lost half its objects, and at least heap.RELEASE_AFTER
        (a large gang deleted); on the watch's thread, where a pause holds up no pass."""
        if self._shrinkage.saw(self._count):
            release_memory()

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
