"""What the dashboard reads, with the user's kubeconfig and S3 credentials: the DDPJobs of a namespace
(or of all), kept current by a watch; a job's pods, Events, metrics, logs and results; the jobs whose
DDPJob is gone but whose ranks kept something in S3. Blocking calls: the server runs them in threads."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ddp_contract import api, labels

from ..job import Job
from ..store import S3Access, StoreError, split_uri

WATCH_SECONDS = 60  # a watch is renewed this often
RETRY_SECONDS = 2.0  # after a watch failed (the API unreachable, the version too old)


def api_error_text(error: Exception) -> str:
    """The API server's answer in words: `403 Forbidden: ddpjobs.ddp.example.com is forbidden: ...`."""
    import json

    status, reason, body = getattr(error, "status", None), getattr(error, "reason", ""), getattr(error, "body", "")
    try:
        message = json.loads(body or "{}").get("message") or ""
    except ValueError:
        message = str(body or "")[:500]
    if status is None:
        return f"cannot reach the Kubernetes API: {error}"
    return f"{status} {reason}: {message}".rstrip(": ")


class JobsWatch:
    """The DDPJobs of one namespace (None: every namespace), listed and then watched in a thread of its own;
    `changed` is called (from that thread) after each change, and `error` holds the API server's refusal
    while it refuses."""

    def __init__(self, api_client: Any, namespace: str | None, changed: Callable[[], None]) -> None:
        from kubernetes import client

        self.custom = client.CustomObjectsApi(api_client)
        self.namespace = namespace
        self.changed = changed
        self.jobs: dict[tuple[str, str], dict[str, Any]] = {}
        self.error: str | None = None
        self.listed = threading.Event()  # the first list answered (or was refused)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"ddpjobs-watch-{namespace or 'all'}", daemon=True)

    def start(self) -> JobsWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _lister(self) -> tuple[Callable[..., Any], tuple[str, ...]]:
        """The list call (watched too) for the namespace or for all, with its arguments."""
        if self.namespace is None:
            return self.custom.list_cluster_custom_object, (api.GROUP, api.VERSION, api.PLURAL)
        return self.custom.list_namespaced_custom_object, (api.GROUP, api.VERSION, self.namespace, api.PLURAL)

    def _list(self) -> str:
        call, args = self._lister()
        listing = call(*args)
        self.jobs = {(j["metadata"]["namespace"], j["metadata"]["name"]): j for j in listing.get("items", [])}
        self.error = None
        return str(listing["metadata"]["resourceVersion"])

    def _run(self) -> None:
        from kubernetes import watch
        from kubernetes.client.rest import ApiException
        from urllib3.exceptions import HTTPError

        version: str | None = None
        while not self._stop.is_set():
            try:
                if version is None:
                    version = self._list()
                    self.listed.set()
                    self.changed()
                call, args = self._lister()
                stream = watch.Watch().stream(call, *args, resource_version=version, timeout_seconds=WATCH_SECONDS)
                for event in stream:
                    if self._stop.is_set():
                        return
                    body = event["object"]
                    if event["type"] == "ERROR":
                        version = None
                        break
                    version = str(body["metadata"]["resourceVersion"])
                    key = (body["metadata"]["namespace"], body["metadata"]["name"])
                    if event["type"] == "DELETED":
                        self.jobs.pop(key, None)
                    else:
                        self.jobs[key] = body
                    self.changed()
            except ApiException as error:
                version = None
                if error.status != 410:  # 410: the version is too old to watch from: listed again at once
                    self._failed(api_error_text(error))
            except (ConnectionError, OSError, HTTPError) as error:
                version = None
                self._failed(f"cannot reach the Kubernetes API: {error}")

    def _failed(self, error: str) -> None:
        """Says why the jobs cannot be read, and waits before the next try."""
        self.error = error
        self.listed.set()
        self.changed()
        self._stop.wait(RETRY_SECONDS)


class Reader:
    """One handle per job (its S3 reads cached as they grow); pods, Events and data workers read fresh."""

    def __init__(self, api_client: Any, s3_access: S3Access) -> None:
        from kubernetes import client

        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.s3_access = s3_access
        self._jobs: dict[tuple[str, str, str | None], Job] = {}
        self._lock = threading.Lock()

    def job(self, namespace: str, name: str, results: str | None = None, access: S3Access | None = None) -> Job:
        """The handle on a job (`results`: its results URI, for one deleted; `access`: S3 settings for it)."""
        with self._lock:
            key = (namespace, name, results)
            if key not in self._jobs:
                self._jobs[key] = Job(name, namespace, self.api_client, access or self.s3_access, results_uri=results)
            return self._jobs[key]

    def pods(self, namespace: str, name: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(the ranks' pods, the data workers' pods)."""
        pods = _items(self.core.list_namespaced_pod(namespace, label_selector=f"{labels.LABEL_JOB_NAME}={name}",
                                                    _preload_content=False))
        ranks = [p for p in pods if labels.LABEL_RANK in (p["metadata"].get("labels") or {})]
        return ranks, [p for p in pods if labels.LABEL_RANK not in (p["metadata"].get("labels") or {})]

    def events(self, namespace: str, name: str, pod_names: list[str] | None = None) -> list[dict[str, Any]]:
        """The Events of the job, and of its pods where their names are given."""
        if pod_names is None:
            return _items(self.core.list_namespaced_event(
                namespace, field_selector=f"involvedObject.kind={api.KIND},involvedObject.name={name}",
                _preload_content=False))
        wanted = {(api.KIND, name), *(("Pod", pod) for pod in pod_names)}
        return [e for e in _items(self.core.list_namespaced_event(namespace, _preload_content=False))
                if ((e.get("involvedObject") or {}).get("kind"), (e.get("involvedObject") or {}).get("name")) in wanted]


def _items(response: Any) -> list[dict[str, Any]]:
    """A list's items as the API server's JSON: read raw, a thousand pods take milliseconds rather than the
    seconds the client's models take to build and turn back into dicts."""
    import json

    items: list[dict[str, Any]] = json.loads(response.data).get("items") or []
    return items


def kept_job_names(access: S3Access, results: str, namespace: str | None) -> list[tuple[str, str]]:
    """(namespace, job) of every job that kept something under the results prefix `results`
    (`<results>/<namespace>/<job>/`), in `namespace` or in any."""
    from botocore.exceptions import BotoCoreError, ClientError

    from ..store import ResultsPrefix

    bucket, base = split_uri(results)
    client = ResultsPrefix(access, results, "-", "-").client
    root = f"{base}/" if base else ""

    def folders(prefix: str) -> list[str]:
        names: list[str] = []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix, Delimiter="/"):
            names += [p["Prefix"][len(prefix):].rstrip("/") for p in page.get("CommonPrefixes", [])]
        return names

    try:
        spaces = [namespace] if namespace else folders(root)
        return [(space, job) for space in spaces for job in folders(f"{root}{space}/")]
    except (BotoCoreError, ClientError) as error:
        raise StoreError(f"listing {results}: {error}") from error
