"""What keeps a gang from its places, other than the scheduler's and the kubelet's own words: a gang
too large for the cluster, and names it needs that others hold.

Too large: its ranks' requests against the allocatable of the nodes they could be scheduled on,
whatever else runs there. Two ways not to fit: one rank needs more of a resource than any one such
node has, or the gang needs more in all than those nodes have together. Either way no amount of
waiting helps until nodes are added, so the job says so while its ranks are pending (GangTooLarge).

In the way (`InTheWay`): a pod, Service or progress identity of the job's name that the job does not
control; the operator never adopts, changes or deletes it, and says so (NameInUse).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from ddp_contract import labels
from ddp_contract.jobspec import JobSpec
from ddp_operator import constants as c
from ddp_operator.failures import PodProblem
from ddp_operator.manifests import node_lost_tolerations
from ddp_operator.nodes import NodeInfo, schedulable_for

SUFFIXES = {
    "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30, "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60, "n": Decimal("1e-9"), "u": Decimal("1e-6"),
    "m": Decimal("1e-3"), "": Decimal(1), "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"),
    "T": Decimal("1e12"), "P": Decimal("1e15"), "E": Decimal("1e18"),
}
# The largest quantity the API server holds: resource.Quantity caps larger ones at int64's maximum.
MAX_QUANTITY = Decimal(2**63 - 1)
QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$")


def parse_quantity(value: Any) -> Decimal | None:
    """A Kubernetes resource quantity ("500m", "64Gi", "8", 8) as a number, held within the API server's
    bounds (1e999999999 is MAX_QUANTITY); None if it is not one."""
    match = QUANTITY.match(str(value).strip())
    if not match:
        return None
    number, suffix = match.group(1), match.group(2) or ""
    try:
        amount = Decimal(number) * SUFFIXES[suffix] if suffix in SUFFIXES else Decimal(number + suffix)  # 1e3
    except InvalidOperation:
        return None
    return max(-MAX_QUANTITY, min(amount, MAX_QUANTITY))


def rank_requests(spec: JobSpec) -> dict[str, Decimal]:
    """What the scheduler reserves for one rank's pod, of the resources judged: the trainer's requests
    (its limits where it sets no request, as the API server defaults them) plus the sidecars'."""
    trainer = {**dict(spec.resources), "limits": {**(spec.resources.get("limits") or {}), c.GPU_RESOURCE: spec.gpus_per_pod}}
    return requests_of([trainer, *(x.get("resources") or {} for x in spec.pod_spec.get("containers") or []
                                   if x.get("name") != labels.CONTAINER_NAME)])


def requests_of(containers: Iterable[Mapping[str, Any]]) -> dict[str, Decimal]:
    """What the scheduler reserves for containers with these `resources`, of the resources judged: their
    requests, their limits where they set no request (as the API server defaults them), summed."""
    total: dict[str, Decimal] = {}
    for resources in containers:
        wanted = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for name in c.CAPACITY_RESOURCES:
            amount = parse_quantity(wanted.get(name, 0)) or Decimal(0)
            total[name] = total.get(name, Decimal(0)) + amount
    return {name: amount for name, amount in total.items() if amount > 0}


def usable_nodes(spec: JobSpec, nodes: Iterable[NodeInfo]) -> list[NodeInfo]:
    """The nodes a rank's pod could be scheduled on, resources aside (nodes.schedulable_for): its template's
    nodeSelector and tolerations, with the ones the operator adds."""
    selector: Mapping[str, str] = spec.pod_spec.get("nodeSelector") or {}
    tolerations = [*(spec.pod_spec.get("tolerations") or []), *node_lost_tolerations(spec)]
    return [node for node in nodes if schedulable_for(node, selector, tolerations)]


def gang_too_large(spec: JobSpec, nodes: Iterable[NodeInfo]) -> str | None:
    """Why the gang cannot fit on the nodes its ranks could use, in words for the job's status; None if
    it could (or if no node could take a rank at all: the scheduler's own message says why better)."""
    selector: Mapping[str, str] = spec.pod_spec.get("nodeSelector") or {}
    usable = usable_nodes(spec, nodes)
    if not usable:
        return None
    counted = f"{len(usable)} schedulable node{'s' if len(usable) > 1 else ''}"
    where = f"the {counted} matching its nodeSelector" if selector else f"the cluster's {counted}"
    unit = "rank" if spec.ranks_per_pod == 1 else "pod"  # of ranksPerPod ranks
    for name, per_rank in rank_requests(spec).items():
        have = [parse_quantity(node.allocatable.get(name, 0)) or Decimal(0) for node in usable]
        if per_rank > max(have):
            return f"each {unit} needs {_amount(name, per_rank)} {name}; the largest of {where} has {_amount(name, max(have))}"
        needed = per_rank * spec.all_pods
        if needed > sum(have):
            return (f"needs {_amount(name, needed)} {name} ({spec.all_pods} {unit}s x {_amount(name, per_rank)}); "
                    f"{where} {'have' if len(usable) > 1 else 'has'} {_amount(name, sum(have, Decimal(0)))} in all")
    return None


def _amount(resource: str, value: Decimal) -> str:
    """8, 0.5 (cpu), 1.5Gi (memory)."""
    if resource == "memory":
        return f"{float(value) / 2**30:g}Gi"
    return f"{float(value):g}"


@dataclass(frozen=True)
class InTheWay:
    """Names the job needs that objects it does not control hold: job-wide ones ("Service mnist")
    and ranks' pods (rank -> pod name). The operator never adopts, changes or deletes them."""

    objects: tuple[str, ...] = ()
    pods: tuple[tuple[int, str], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.objects or self.pods)

    def problems(self, world_size: int, live_indices: Iterable[int]) -> tuple[PodProblem, ...]:
        """The ranks they hold up: every rank not yet created for a job-wide one, the rank for a pod."""
        advice = "; the operator never adopts, changes or deletes it: delete it, or rename the job"
        found: list[PodProblem] = []
        if self.objects:
            held = ", ".join(self.objects)
            live = set(live_indices)
            found += [PodProblem(r, c.REASON_NAME_IN_USE, f"{held} exists and is not this job's{advice}")
                      for r in range(world_size) if r not in live]
        found += [PodProblem(rank, c.REASON_NAME_IN_USE, f"pod {pod} exists and is not this job's{advice}")
                  for rank, pod in self.pods]
        return tuple(found)
