"""Nodes as the operator judges them, from a slim copy of each: which are lost to a job (NotReady past
its spec.nodeLostGraceSeconds, or deleted) and which a rank could be scheduled on.

A node counts as lost once its Ready condition has been False (NotReady) or Unknown (the kubelet
stopped posting status) for the grace, or as soon as the node watch has seen it deleted. A node the
watch never saw is not judged: the pod GC controller deletes pods bound to it within a minute.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ddp_contract.timestamps import parse_rfc3339, rfc3339

# Taint effects that keep a pod off a node (PreferNoSchedule only discourages).
BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


@dataclass(frozen=True)
class Taint:
    key: str
    value: str = ""
    effect: str = ""


@dataclass(frozen=True)
class NodeInfo:
    """What the operator reads of a node; heartbeats are left out, so an unchanged copy means no news."""

    name: str
    ready: str = ""  # the Ready condition's status: True, False or Unknown; "" before the kubelet reported
    ready_reason: str = ""
    ready_since: datetime | None = None  # the Ready condition's lastTransitionTime
    unschedulable: bool = False  # cordoned
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    allocatable: Mapping[str, str] = field(default_factory=dict)


def node_info(node: Mapping[str, Any]) -> NodeInfo:
    """The slim copy of a Node as the API returns it."""
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    ready: Mapping[str, Any] = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})
    return NodeInfo(
        name=(node.get("metadata") or {}).get("name", ""),
        ready=str(ready.get("status") or ""),
        ready_reason=str(ready.get("reason") or ""),
        ready_since=parse_rfc3339(ready.get("lastTransitionTime")),
        unschedulable=bool(spec.get("unschedulable")),
        labels=dict((node.get("metadata") or {}).get("labels") or {}),
        taints=tuple(Taint(t.get("key", ""), t.get("value") or "", t.get("effect") or "") for t in spec.get("taints") or []),
        allocatable={k: str(v) for k, v in (status.get("allocatable") or {}).items()},
    )


@dataclass(frozen=True)
class Nodes:
    """The node watch's view: every node by name, and when it saw each deleted one go.

    `synced` is False until the first list arrived (or when the operator may not list nodes): then
    nothing is judged, neither lost nodes nor a gang's fit.
    """

    known: Mapping[str, NodeInfo] = field(default_factory=dict)
    deleted: Mapping[str, datetime] = field(default_factory=dict)
    synced: bool = False


def not_ready_since(node: NodeInfo) -> datetime | None:
    """When the node stopped being Ready; None while it is Ready (or has not reported yet)."""
    return node.ready_since if node.ready in ("False", "Unknown") else None


def lost_nodes(names: Iterable[str], nodes: Nodes, grace: float, now: datetime) -> dict[str, str]:
    """The nodes among `names` that are lost now, each with why, in words for the job's status."""
    if not nodes.synced:
        return {}
    lost: dict[str, str] = {}
    for name in set(names):
        if name in nodes.deleted and name not in nodes.known:
            lost[name] = f"node {name} was deleted at {rfc3339(nodes.deleted[name])}"
            continue
        node = nodes.known.get(name)
        since = not_ready_since(node) if node else None
        if node and since and (now - since).total_seconds() >= grace:
            status = f"Ready {node.ready}" + (f": {node.ready_reason}" if node.ready_reason else "")
            lost[name] = f"node {name} NotReady since {rfc3339(since)} ({status})"
    return lost


def seconds_until_lost(names: Iterable[str], nodes: Nodes, grace: float, now: datetime) -> float | None:
    """Seconds until the first of these nodes that is NotReady now would count as lost; None if none is."""
    waits = []
    for name in set(names):
        node = nodes.known.get(name)
        since = not_ready_since(node) if node else None
        if since is not None:
            waits.append(grace - (now - since).total_seconds())
    pending = [w for w in waits if w > 0]
    return min(pending) if pending else None


def tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Taint) -> bool:
    """Whether a pod with these tolerations may stay on (and be scheduled to) a node with the taint."""
    for toleration in tolerations:
        if toleration.get("effect") and toleration["effect"] != taint.effect:
            continue
        exists = toleration.get("operator", "Equal") == "Exists"
        key = toleration.get("key") or ""
        if not key:
            if exists:
                return True
            continue
        if key == taint.key and (exists or (toleration.get("value") or "") == taint.value):
            return True
    return False


def schedulable_for(node: NodeInfo, node_selector: Mapping[str, str], tolerations: Iterable[Mapping[str, Any]]) -> bool:
    """Whether the scheduler could place a pod with this nodeSelector and these tolerations on the node,
    resources aside: Ready, not cordoned, labels matching, every blocking taint tolerated.

    Node affinity is not looked at, so this may count a node the pod cannot use, never the reverse.
    """
    tolerations = list(tolerations)
    return (
        node.ready == "True"
        and not node.unschedulable
        and all(node.labels.get(key) == value for key, value in node_selector.items())
        and all(tolerates(tolerations, t) for t in node.taints if t.effect in BLOCKING_EFFECTS)
    )
