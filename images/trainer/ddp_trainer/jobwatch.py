"""A rank's read-only view of its own DDPJob: the gang attempt and last checkpoint the operator and
rank 0 record in its status, kept current by a watch (restartStrategy InPlace).

The ranks' Role allows get, list and watch on their one job (resourceNames), so the watch lists by
`metadata.name`. A watch that ends or fails is started again from where it was, after a pause that
grows to WATCH_RETRY_MAX_S while the API server cannot be reached.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ddp_contract import kubeclient
from ddp_contract.api import GROUP, PLURAL, VERSION
from ddp_contract.jobstatus import STATUS_MEMBERS
from ddp_contract.resource import JobStatus

log = logging.getLogger(__name__)

WATCH_SECONDS = 300  # the API server ends each watch after this long; it is started again at once
WATCH_RETRY_MAX_S = 10.0


@dataclass(frozen=True)
class JobView:
    attempt: int
    checkpoint: str | None  # status.lastCheckpoint.uri
    phase: str | None
    members: tuple[int, ...] | None = None  # status.members: the attempt's pod indices in rank order (elastic jobs)
    checkpoint_requested: str | None = None  # status.checkpointRequested.since: a checkpoint is asked for
    formed: int | None = None  # status.rendezvous.attempt: the last attempt whose gang formed

    @classmethod
    def of(cls, job: Mapping[str, Any]) -> JobView:
        status = JobStatus.of_job(job)
        members = status.members
        if members is None and status.raw.get(STATUS_MEMBERS) is not None:
            log.warning("ignoring status.%s %r: not a list of distinct pod indices", STATUS_MEMBERS,
                        status.raw.get(STATUS_MEMBERS))
        return cls(status.attempt, status.checkpoint_uri, status.phase, members, status.checkpoint_requested_since,
                   status.formed_attempt)


class JobWatch:
    """The newest JobView of one job; `wait` blocks until a view passes a test."""

    def __init__(self, namespace: str, name: str, api_client: Any = None) -> None:
        from kubernetes import client

        self.api = client.CustomObjectsApi(api_client or kubeclient.api_client())
        self.namespace = namespace
        self.name = name
        self._view: JobView | None = None
        self._changed = threading.Condition()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"watch-{name}", daemon=True)

    def start(self) -> JobWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        with self._changed:
            self._changed.notify_all()

    @property
    def view(self) -> JobView | None:
        with self._changed:
            return self._view

    def wait(self, test: Callable[[JobView], bool], timeout_s: float | None = None,
             also: Callable[[], bool] = lambda: False) -> JobView | None:
        """The first view that passes `test`, or None once `timeout_s` passed, `also()` holds (checked
        at least every second) or the watch was stopped."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._changed:
            while True:
                if self._view is not None and test(self._view):
                    return self._view
                left = None if deadline is None else deadline - time.monotonic()
                if (left is not None and left <= 0) or also() or self._stopped.is_set():
                    return None
                self._changed.wait(1.0 if left is None else min(left, 1.0))

    def _put(self, job: Mapping[str, Any]) -> None:
        with self._changed:
            self._view = JobView.of(job)
            self._changed.notify_all()

    def _run(self) -> None:
        from kubernetes import watch

        delay = 0.5
        version: str | None = None
        while not self._stopped.is_set():
            try:
                if version is None:
                    listed = self.api.list_namespaced_custom_object(
                        GROUP, VERSION, self.namespace, PLURAL, field_selector=f"metadata.name={self.name}",
                        _request_timeout=30)
                    for item in listed.get("items") or []:
                        self._put(item)
                    version = listed["metadata"]["resourceVersion"]
                stream = watch.Watch().stream(
                    self.api.list_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL,
                    field_selector=f"metadata.name={self.name}", resource_version=version,
                    timeout_seconds=WATCH_SECONDS, _request_timeout=WATCH_SECONDS + 30)
                for event in stream:
                    if self._stopped.is_set():
                        return
                    job = event["object"]
                    if event["type"] == "ERROR":
                        version = None  # expired (410 Gone): list again
                        break
                    version = job["metadata"]["resourceVersion"]
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._put(job)
                delay = 0.5
            except Exception as error:  # noqa: BLE001 - the API server may be away for a while; try again
                log.warning("watching DDPJob %s/%s: %s; trying again in %.0fs", self.namespace, self.name, error,
                            delay)
                version = None
                self._stopped.wait(delay)
                delay = min(delay * 2, WATCH_RETRY_MAX_S)
