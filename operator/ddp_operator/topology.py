"""spec.topology without Kueue: the operator's own choice of the topology domains (the nodes that share
a value of a node label: a rack, a block, a zone) a gang's pods go to.

Room: how many of the gang's pods each domain can take now, from its nodes' allocatable less what the
DDPJob pods bound there request (pods of other kinds are not seen: where they fill a domain, the pods
wait Pending and the job says Unschedulable), counting only the nodes the pods could be scheduled on
(Ready, not cordoned, matching the template's nodeSelector, taints tolerated).

The choice: the domain with the least room that still holds the whole gang, leaving the larger ones
to larger gangs (ties by the label's value). None holds it: `required` waits, saying how much room
the best domain has; `preferred` fills the domains with the most room first, pod i after pod i-1, so
neighbouring ranks share a domain. A gang with pods already running (a replaced pod, an elastic gang
growing) stays where most of them are.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from ddp_contract import labels
from ddp_contract.jobspec import JobSpec, TopologySpec
from ddp_operator.capacity import parse_quantity, rank_requests, requests_of, usable_nodes
from ddp_operator.nodes import NodeInfo, Nodes
from ddp_operator.placement import Placement

PODS = "pods"  # the node's pod slots, one for each pod


class NoDomain(Exception):
    """No domain can hold the gang now (required): the message says what the best one has."""


def used_by_node(pods: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Decimal]]:
    """What the pods bound to each node request (their containers' requests, else limits), with one pod slot
    each; pods that ended hold nothing."""
    used: dict[str, dict[str, Decimal]] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        held = used.setdefault(node, {})
        containers = (x.get("resources") or {} for x in (pod.get("spec") or {}).get("containers") or [])
        for name, amount in {**requests_of(containers), PODS: Decimal(1)}.items():
            held[name] = held.get(name, Decimal(0)) + amount
    return used


def running_domains(pods: Iterable[Mapping[str, Any]], attempt: int, nodes: Nodes, key: str) -> list[str]:
    """The domains of the attempt's pods bound to a node with the label, not being deleted."""
    found = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        node = nodes.known.get((pod.get("spec") or {}).get("nodeName") or "")
        if (node is None or meta.get("deletionTimestamp")
                or (meta.get("labels") or {}).get(labels.LABEL_ATTEMPT) != str(attempt)):
            continue
        if key in node.labels:
            found.append(node.labels[key])
    return found


def room_by_domain(spec: JobSpec, nodes: Iterable[NodeInfo], used: Mapping[str, Mapping[str, Decimal]]) -> dict[str, int]:
    """How many of the gang's pods each domain (a value of spec.topology's label) can take now."""
    topology = spec.topology
    assert topology is not None
    per_pod = {**rank_requests(spec), PODS: Decimal(1)}
    room: dict[str, int] = {}
    for node in usable_nodes(spec, nodes):
        domain = node.labels.get(topology.key)
        if domain is None:
            continue
        held = used.get(node.name, {})
        fits = min(int(max(Decimal(0), (parse_quantity(node.allocatable.get(name, 0)) or Decimal(0))
                           - held.get(name, Decimal(0))) // amount) for name, amount in per_pod.items())
        room[domain] = room.get(domain, 0) + fits
    return room


def choose_domains(spec: JobSpec, room: Mapping[str, int], running: Iterable[str] = ()) -> Placement:
    """Each pod's domain (by pod index) for the gang; raises NoDomain for a required topology no domain
    holds. running: the domains of the gang's pods that run already."""
    topology = spec.topology
    assert topology is not None
    key, pods = topology.key, spec.all_pods
    here = Counter(running)
    if here:
        stay = min(here, key=lambda d: (-here[d], d))
        return _placement(topology, [stay] * pods)
    holding = [d for d in room if room[d] >= pods]
    if holding:
        return _placement(topology, [min(holding, key=lambda d: (room[d], d))] * pods)
    if topology.required:
        if not room:
            raise NoDomain(f"no node the pods could be scheduled on has the label {key}")
        best = min(room, key=lambda d: (-room[d], d))
        raise NoDomain(f"no {key} domain has room for the gang's {pods} pods now: the most is {key}={best}, "
                       f"with room for {room[best]} (its nodes' allocatable less what DDPJob pods request there)")
    order: list[str] = []
    for domain in sorted(room, key=lambda d: (-room[d], d)):
        order.extend([domain] * room[domain])
    return _placement(topology, order[:pods])


def _placement(topology: TopologySpec, domains: list[str]) -> Placement:
    return Placement(domains=tuple({topology.key: d} for d in domains), domains_preferred=not topology.required)
