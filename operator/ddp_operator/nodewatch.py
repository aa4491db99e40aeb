"""The operator's view of the cluster's nodes: a list+watch of every node, kept as nodes.NodeInfo.

A node's heartbeats change nothing kept, so only news (Ready flipped, a taint, cordoned, deleted,
allocatable changed) reaches on_change, with the names of the nodes concerned. Deleted nodes are
remembered for a while, so the jobs whose ranks were on one can say which node went.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes import client

from ddp_operator.listwatch import ListWatch
from ddp_operator.nodes import NodeInfo, Nodes, node_info

OnNodes = Callable[[set[str]], None]
# Past this, nothing can still be bound to a deleted node: the pod GC controller deletes such pods
# within a minute.
FORGET_DELETED_AFTER = timedelta(minutes=10)


class NodeCache(ListWatch):
    def __init__(self, api: client.ApiClient, on_change: OnNodes, watch_timeout: int = 300) -> None:
        super().__init__("node", watch_timeout)
        self._core = client.CoreV1Api(api)
        self._on_change = on_change
        self._lock = threading.Lock()
        self._known: dict[str, NodeInfo] = {}
        self._deleted: dict[str, datetime] = {}

    def snapshot(self) -> Nodes:
        """The view now; the maps are replaced, never changed, so it stays as it was taken."""
        with self._lock:
            return Nodes(self._known, self._deleted, self.synced.is_set())

    def _call(self, **kwargs: Any) -> Any:
        return self._core.list_node(**kwargs)

    def _replace(self, items: list[dict[str, Any]]) -> None:
        fresh = {info.name: info for info in map(node_info, items)}
        now = datetime.now(UTC)
        with self._lock:
            gone = set(self._known) - set(fresh)
            changed = gone | {name for name, info in fresh.items() if self._known.get(name) != info}
            self._deleted = {**self._deleted, **dict.fromkeys(gone, now)}
            self._forget(fresh, now)
            self._known = fresh
        self._notify(changed)

    def _apply(self, kind: str, node: dict[str, Any]) -> None:
        info = node_info(node)
        now = datetime.now(UTC)
        with self._lock:
            if kind == "DELETED":
                self._known = {name: known for name, known in self._known.items() if name != info.name}
                self._deleted = {**self._deleted, info.name: now}
            elif self._known.get(info.name) == info:
                return
            else:
                self._known = {**self._known, info.name: info}
            self._forget(self._known, now)
        self._notify({info.name})

    def _forget(self, known: Iterable[str], now: datetime) -> None:
        """Drops deletions long past, and those of nodes that exist again."""
        present = set(known)
        self._deleted = {name: at for name, at in self._deleted.items()
                         if name not in present and now - at < FORGET_DELETED_AFTER}

    def _notify(self, names: set[str]) -> None:
        if names and not self.stopping:
            self._on_change(names)
