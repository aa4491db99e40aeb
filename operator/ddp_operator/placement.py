"""Where a gang's pods go, as what is added to each pod built from the spec: node labels, tolerations,
labels and annotations for every pod of a pod set, and each pod's topology domain (a nodeSelector, or a
preference of its node affinity). Made by Kueue's admission (kueue/flavors.py) or by the operator's
own topology placement (topology.py); applied by `place` to the pods the operator creates.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


class PlacementConflict(ValueError):
    """What Kueue's admission asks of a pod contradicts what the pod asks itself (or another update)."""


@dataclass(frozen=True)
class Placement:
    """What is added to each pod of one pod set. domains: the node labels of each pod's topology domain,
    by pod index (empty: not placed by topology); a nodeSelector, or with domains_preferred a preference
    of the pod's node affinity (a pod without a domain has no preference)."""

    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    domains: tuple[Mapping[str, str], ...] = ()
    domains_preferred: bool = False


NOWHERE = Placement()


@dataclass(frozen=True)
class GangPlacement:
    """Where the ranks' pods and the data workers' pods go."""

    ranks: Placement = NOWHERE
    data_workers: Placement = NOWHERE


ANYWHERE = GangPlacement()


def merge_labels(into: dict[str, str], more: Mapping[str, str], what: str, where: str) -> None:
    for key, value in more.items():
        if key in into and into[key] != value:
            raise PlacementConflict(f"{where} asks for {what} {key}={value}, where {into[key]} is asked for already")
        into[key] = value


def with_tolerations(tolerations: Iterable[Mapping[str, Any]], more: Iterable[Mapping[str, Any]]
                      ) -> list[Mapping[str, Any]]:
    out = list(tolerations)
    for toleration in more:
        if not any(_same_toleration(toleration, t) for t in out):
            out.append(toleration)
    return out


def _same_toleration(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    keys = ("key", "operator", "value", "effect", "tolerationSeconds")
    defaults = {"operator": "Equal"}
    return all((a.get(k) or defaults.get(k)) == (b.get(k) or defaults.get(k)) for k in keys)


def place(pod: Mapping[str, Any], placement: Placement, index: int) -> dict[str, Any]:
    """`pod` (pod `index` of its pod set) with what the placement adds; the pod's own nodeSelector, labels
    and annotations are kept, and a different value asked for one of their keys raises PlacementConflict."""
    if placement == NOWHERE:
        return dict(pod)
    placed = copy.deepcopy(dict(pod))
    meta, spec = placed.setdefault("metadata", {}), placed.setdefault("spec", {})
    name = meta.get("name", f"pod {index}")
    selector = dict(placement.node_selector)
    domain = placement.domains[index] if index < len(placement.domains) else {}
    if domain and not placement.domains_preferred:
        merge_labels(selector, domain, "topology domain label", "the topology assignment")
    for what, key, wanted in (("nodeSelector", "nodeSelector", selector), ("label", "labels", placement.labels),
                              ("annotation", "annotations", placement.annotations)):
        own = dict((spec if key == "nodeSelector" else meta).get(key) or {})
        try:
            merge_labels(own, wanted, what, "the placement")
        except PlacementConflict as conflict:
            raise PlacementConflict(f"{conflict} by {name}'s template") from None
        if own:
            (spec if key == "nodeSelector" else meta)[key] = own
    tolerations = with_tolerations(spec.get("tolerations") or [], placement.tolerations)
    if tolerations:
        spec["tolerations"] = tolerations
    if domain and placement.domains_preferred:
        affinity = spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
        preferred = affinity.setdefault("preferredDuringSchedulingIgnoredDuringExecution", [])
        preferred.append({"weight": 100, "preference": {"matchExpressions": [
            {"key": k, "operator": "In", "values": [v]} for k, v in domain.items()]}})
    return placed


def first_of_each_domain(placement: Placement, indices: Sequence[int]) -> list[int]:
    """Of the pod `indices`, the first placed in each topology domain (and the first without one): what
    `place` refuses depends on the pod set and the pod's domain, the same for every pod of a domain."""
    seen: set[frozenset[tuple[str, str]]] = set()
    first: list[int] = []
    for index in indices:
        domain = frozenset((placement.domains[index] if index < len(placement.domains) else {}).items())
        if domain not in seen:
            seen.add(domain)
            first.append(index)
    return first
