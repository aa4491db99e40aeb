"""Where Kueue's admission puts an admitted gang's pods, read as Kueue's own job integrations read it
(its podset package: FromAssignment, FromUpdate, Merge):

- the node labels (as nodeSelector) and tolerations of each ResourceFlavor assigned to the pod set,
  so a queue with an A100 flavor and an H100 flavor puts the job on the GPUs it was admitted for;
- the labels, annotations, nodeSelector and tolerations its admission checks ask for (podSetUpdates);
- where Kueue placed the pod set by topology (status.admission's topologyAssignment), each pod's
  domain as nodeSelector, pod `i` in the `i`-th place of the assignment, so that neighbouring ranks
  share a domain, and an annotation that marks the pod as placed by topology, without which Kueue
  would count its resources a second time as those of a pod it does not manage.

Pure: the caller reads the Workload and the ResourceFlavors it names; placement.py applies the result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ddp_operator.placement import NOWHERE, Placement, PlacementConflict, merge_labels, with_tolerations

# Kueue's pod annotations for a pod set placed by topology (apis/kueue/v1beta2/topology_types.go).
REQUIRED_TOPOLOGY_ANNOTATION = "kueue.x-k8s.io/podset-required-topology"
PREFERRED_TOPOLOGY_ANNOTATION = "kueue.x-k8s.io/podset-preferred-topology"
UNCONSTRAINED_TOPOLOGY_ANNOTATION = "kueue.x-k8s.io/podset-unconstrained-topology"


class FlavorMissing(Exception):
    """A ResourceFlavor the admission assigned cannot be read (deleted since, or not readable)."""


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
                 count: int, topology_request: tuple[str, str] | None = None) -> Placement:
    """What Kueue's admission adds to each of the `count` pods of `pod_set`; NOWHERE when the Workload
    says nothing of it. flavors: the ResourceFlavors by name (every one assigned_flavors names).
    topology_request: the pod set's (annotation, node label) when it asked for a topology; a pod set
    placed by topology without one is marked unconstrained, as Kueue marks it.

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
        tolerations = with_tolerations(tolerations, spec.get("tolerations") or [])
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    for check in (workload.get("status") or {}).get("admissionChecks") or []:
        for update in check.get("podSetUpdates") or []:
            if update.get("name") != pod_set:
                continue
            where = f"admission check {check.get('name')}"
            merge_labels(node_selector, update.get("nodeSelector") or {}, "nodeSelector", where)
            merge_labels(labels, update.get("labels") or {}, "label", where)
            merge_labels(annotations, update.get("annotations") or {}, "annotation", where)
            tolerations = with_tolerations(tolerations, update.get("tolerations") or [])
    topology = assignment.get("topologyAssignment")
    domains = topology_domains(topology, count) if topology else ()
    if domains:
        key, value = topology_request or (UNCONSTRAINED_TOPOLOGY_ANNOTATION, "true")
        merge_labels(annotations, {key: value}, "annotation", "the topology assignment")
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
