"""The operator's view of its own pods: a label-selected list+watch kept in memory.

kopf watches every object of a kind and filters labels on the client, so a busy cluster's pods
would all stream through the operator. This watch asks the API server for our pods only
(the job-name label selector), and keeps a slim copy of each, grouped by job.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable

from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.watch.watch import iter_resp_lines

from ddp_contract.labels import LABEL_JOB_NAME

log = logging.getLogger(__name__)

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
        },
        "spec": {"nodeName": pod.get("spec", {}).get("nodeName")},
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


def job_key(pod: dict) -> JobKey | None:
    meta = pod.get("metadata", {})
    job = meta.get("labels", {}).get(LABEL_JOB_NAME)
    return (meta.get("namespace"), job) if job else None


class PodCache:
    def __init__(self, api: client.ApiClient, on_change: OnChange, watch_timeout: int = 300) -> None:
        self._core = client.CoreV1Api(api)
        self._on_change = on_change
        self._watch_timeout = watch_timeout
        self._lock = threading.Lock()
        self._by_job: dict[JobKey, dict[str, dict]] = {}
        self.synced = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def pods(self, key: JobKey) -> list[dict]:
        with self._lock:
            return list(self._by_job.get(key, {}).values())

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="pod-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                version = self._relist()
                while not self._stop.is_set():
                    version = self._watch(version)
            except ApiException as error:
                if error.status != 410:  # 410 Gone: the resource version expired; relist
                    log.warning("pod watch failed (%s); relisting", error.reason)
                    self._stop.wait(1.0)
            except Exception:  # a dropped connection must not end the watch for good
                log.exception("pod watch broke; relisting")
                self._stop.wait(1.0)

    def _relist(self) -> str:
        response = self._core.list_pod_for_all_namespaces(label_selector=LABEL_JOB_NAME, _preload_content=False)
        listing = json.loads(response.data)
        fresh: dict[JobKey, dict[str, dict]] = {}
        for pod in listing.get("items", []):
            key = job_key(pod)
            if key:
                fresh.setdefault(key, {})[pod["metadata"]["name"]] = slim_pod(pod)
        with self._lock:
            changed = set(self._by_job) | set(fresh)
            self._by_job = fresh
        self.synced.set()
        self._notify(changed)
        return listing["metadata"]["resourceVersion"]

    def _watch(self, version: str) -> str:
        response = self._core.list_pod_for_all_namespaces(
            label_selector=LABEL_JOB_NAME,
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=version,
            timeout_seconds=self._watch_timeout,
            _preload_content=False,
        )
        try:
            for line in iter_resp_lines(response):
                event = json.loads(line)
                kind, pod = event["type"], event["object"]
                if kind == "ERROR":
                    raise ApiException(status=pod.get("code", 500), reason=pod.get("message"))
                version = pod.get("metadata", {}).get("resourceVersion", version)
                if kind != "BOOKMARK":
                    self._apply(kind, pod)
                if self._stop.is_set():
                    break
        finally:
            response.release_conn()
        return version

    def _apply(self, kind: str, pod: dict) -> None:
        key = job_key(pod)
        if key is None:
            return
        name = pod["metadata"]["name"]
        with self._lock:
            pods = self._by_job.setdefault(key, {})
            if kind == "DELETED":
                pods.pop(name, None)
                if not pods:
                    del self._by_job[key]
            else:
                pods[name] = slim_pod(pod)
        self._notify([key])

    def _notify(self, keys: Iterable[JobKey]) -> None:
        for key in keys:
            if self._stop.is_set():  # the operator is stopping: its event loop may be closed
                return
            self._on_change(key)
