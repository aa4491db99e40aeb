"""Where Kueue's admission puts an admitted gang's pods, applied as Kueue's own job integrations apply
it (its podset package: FromAssignment, FromUpdate, Merge) to the pods the operator creates:

- the node labels (as nodeSelector) and tolerations of each ResourceFlavor assigned to the pod set,
  so a queue with an A100 flavor and an H100 flavor puts the job on the GPUs it was admitted for;
- the labels, annotations, nodeSelector and tolerations its admission checks ask for (podSetUpdates);
- where Kueue placed the pod set by topology (status.admission's topologyAssignment), each pod's
  domain as nodeSelector, pod `i` in the `i`-th place of the assignment, so that neighbouring ranks
  share a domain, and an annotation that marks the pod as placed by topology, without which Kueue
  would count its resources a second time as those of a pod it does not manage.

Pure: the caller reads the Workload and the ResourceFlavors it names.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# Kueue's pod annotations for a pod set placed by topology (apis/kueue/v1beta2/topology_types.go).
REQUIRED_TOPOLOGY_ANNOTATION = "kueue.x-k8s.io/podset-required-topology"
PREFERRED_TOPOLOGY_ANNOTATION = "kueue.x-k8s.io/podset-preferred-topology"
UNCONSTRAINED_TOPOLOGY_ANNOTATION = "kueue.x-k8s.io/podset-unconstrained-topology"
TOPOLOGY_ANNOTATIONS = (REQUIRED_TOPOLOGY_ANNOTATION, PREFERRED_TOPOLOGY_ANNOTATION, UNCONSTRAINED_TOPOLOGY_ANNOTATION)


class PlacementConflict(ValueError):
    """What Kueue's admission asks of a pod contradicts what the pod asks itself (or another update)."""


class FlavorMissing(Exception):
    """A ResourceFlavor the admission assigned cannot be read (deleted since, or not readable)."""


@dataclass(frozen=True)
class Placement:
    """What admission adds to each pod of one pod set. domains: the nodeSelector of each pod's topology
    domain, by pod index (empty when Kueue did not place the pod set by topology)."""

    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    domains: tuple[Mapping[str, str], ...] = ()


NOWHERE = Placement()


@dataclass(frozen=True)
class GangPlacement:
    """Where admission puts the ranks' pods and the data workers' pods, and the annotation that says what
    topology the ranks asked for (key, node label), if any."""

    ranks: Placement = NOWHERE
    data_workers: Placement = NOWHERE
    topology_annotation: tuple[str, str] | None = None


ANYWHERE = GangPlacement()


def assignment_of(workload: Mapping[str, Any], pod_set: str) -> Mapping[str, Any] | None:
    """The admission's podSetAssignment of `pod_set`; None when the Workload is not admitted or names it not."""
    admission = (workload.get("status") or {}).get("admission") or {}
    return next((a for a in admission.get("podSetAssignments") or [] if a.get("name") == pod_set), None)


def assigned_flavors(workload: Mapping[str, Any]) -> list[str]:
    """Every ResourceFlavor the admission assigns to any pod set, each once, in a fixed order."""
    admission = (workload.get("status") or {}).get("admission") or {}
    names: list[str] = []
    for assignment in admission.get("podSetAssignments") or []:
        names.extend(_flavors(assignment))
    return list(dict.fromkeys(names))


def _flavors(assignment: Mapping[str, Any]) -> list[str]:
    flavors = assignment.get("flavors") or {}
    return list(dict.fromkeys(str(flavors[resource]) for resource in sorted(flavors)))


def placement_of(workload: Mapping[str, Any], pod_set: str, flavors: Mapping[str, Mapping[str, Any]],
                 count: int) -> Placement:
    """What Kueue's admission adds to each of the `count` pods of `pod_set`; NOWHERE when the Workload
    says nothing of it. flavors: the ResourceFlavors by name (every one assigned_flavors names).

    Raises PlacementConflict when two admission checks ask for different values of one key, and
    KeyError naming a flavor missing from `flavors`."""
    assignment = assignment_of(workload, pod_set)
    if assignment is None:
        return NOWHERE
    node_selector: dict[str, str] = {}
    tolerations: list[Mapping[str, Any]] = []
    for name in _flavors(assignment):
        spec = flavors[name].get("spec") or {}
        node_selector.update(spec.get("nodeLabels") or {})  # as Kueue: a later flavor's label wins
        tolerations = _with_tolerations(tolerations, spec.get("tolerations") or [])
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    for check in (workload.get("status") or {}).get("admissionChecks") or []:
        for update in check.get("podSetUpdates") or []:
            if update.get("name") != pod_set:
                continue
            where = f"admission check {check.get('name')}"
            _merge(node_selector, update.get("nodeSelector") or {}, "nodeSelector", where)
            _merge(labels, update.get("labels") or {}, "label", where)
            _merge(annotations, update.get("annotations") or {}, "annotation", where)
            tolerations = _with_tolerations(tolerations, update.get("tolerations") or [])
    topology = assignment.get("topologyAssignment")
    domains = topology_domains(topology, count) if topology else ()
    return Placement(node_selector, tuple(tolerations), labels, annotations, domains)


def topology_domains(topology: Mapping[str, Any], count: int) -> tuple[dict[str, str], ...]:
    """A topologyAssignment (v1beta2: levels and slices of domains) as the nodeSelector of each of
    `count` pods: the first domain's pods first. Raises PlacementConflict when it places fewer pods."""
    levels: Sequence[str] = topology.get("levels") or []
    pods: list[dict[str, str]] = []
    for piece in topology.get("slices") or []:
        domains = int(piece.get("domainCount") or 0)
        values = [_level_values(level, domains) for level in piece.get("valuesPerLevel") or []]
        counts = piece.get("podCounts") or {}
        per_domain = ([int(n) for n in counts["individual"]] if counts.get("individual")
                      else [int(counts.get("universal") or 0)] * domains)
        for d in range(domains):
            selector = {level: values[i][d] for i, level in enumerate(levels)}
            pods.extend(dict(selector) for _ in range(per_domain[d]))
    if len(pods) < count:
        raise PlacementConflict(f"Kueue's topology assignment places {len(pods)} pods, the pod set has {count}")
    return tuple(pods[:count])


def _level_values(level: Mapping[str, Any], domains: int) -> list[str]:
    if level.get("universal") is not None:
        return [str(level["universal"])] * domains
    individual = level.get("individual") or {}
    prefix, suffix = individual.get("prefix") or "", individual.get("suffix") or ""
    return [f"{prefix}{root}{suffix}" for root in individual.get("roots") or []]


def _merge(into: dict[str, str], more: Mapping[str, str], what: str, where: str) -> None:
    for key, value in more.items():
        if key in into and into[key] != value:
            raise PlacementConflict(f"{where} asks for {what} {key}={value}, where {into[key]} is asked for already")
        into[key] = value


def _with_tolerations(tolerations: Iterable[Mapping[str, Any]], more: Iterable[Mapping[str, Any]]
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


def place(pod: Mapping[str, Any], placement: Placement, index: int, topology_annotation: tuple[str, str] | None = None
          ) -> dict[str, Any]:
    """`pod` (pod `index` of its pod set) with what admission adds; the pod's own nodeSelector, labels
    and annotations are kept, and a different value asked for one of their keys raises PlacementConflict.
    topology_annotation: the annotation of the topology the pod set asked for, (key, node label), for
    a pod placed by topology; without one such a pod is marked unconstrained, as Kueue marks it."""
    if placement == NOWHERE:
        return dict(pod)
    placed = copy.deepcopy(dict(pod))
    meta, spec = placed.setdefault("metadata", {}), placed.setdefault("spec", {})
    name = meta.get("name", f"pod {index}")
    selector = dict(placement.node_selector)
    if placement.domains:
        _merge(selector, placement.domains[index], "topology domain label", "the topology assignment")
    for what, key, wanted in (("nodeSelector", "nodeSelector", selector), ("label", "labels", placement.labels),
                              ("annotation", "annotations", placement.annotations)):
        own = dict((spec if key == "nodeSelector" else meta).get(key) or {})
        try:
            _merge(own, wanted, what, "Kueue's admission")
        except PlacementConflict as conflict:
            raise PlacementConflict(f"{conflict} by {name}'s template") from None
        if own:
            (spec if key == "nodeSelector" else meta)[key] = own
    tolerations = _with_tolerations(spec.get("tolerations") or [], placement.tolerations)
    if tolerations:
        spec["tolerations"] = tolerations
    if placement.domains:
        annotations = meta.setdefault("annotations", {})
        if not any(a in annotations for a in TOPOLOGY_ANNOTATIONS):
            key, value = topology_annotation or (UNCONSTRAINED_TOPOLOGY_ANNOTATION, "true")
            annotations[key] = value
    return placed
