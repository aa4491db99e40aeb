"""A list, then a watch from the list's resourceVersion, on a thread of its own: the loop under the
operator's pod and node caches. Any break (410 Gone, a dropped connection) lists again."""

from __future__ import annotations

import json
import logging
import threading
from abc import ABC, abstractmethod
from typing import Any

from kubernetes.client.rest import ApiException
from kubernetes.watch.watch import iter_resp_lines

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
