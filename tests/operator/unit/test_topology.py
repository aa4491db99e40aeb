"""spec.topology without Kueue: how much room each domain has, and which domains a gang's pods go to."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from ddp_contract import labels
from ddp_operator.nodes import NodeInfo, Nodes, Taint
from ddp_operator.topology import NoDomain, choose_domains, room_by_domain, running_domains, used_by_node
from podfixtures import job_spec

RACK = "example.com/rack"


def node(name: str, rack: str | None, cpu: str = "8", **info: Any) -> NodeInfo:
    node_labels = {RACK: rack} if rack else {}
    return NodeInfo(name=name, ready="True", labels={**node_labels, **info.pop("labels", {})},
                    allocatable={"cpu": cpu, "memory": "64Gi", "pods": "110"}, **info)


def topology_job(pods: int = 4, cpu: str = "4", preferred: bool = False, **spec: Any) -> Any:
    return job_spec(worldSize=pods, gpusPerRank=0, resources={"requests": {"cpu": cpu}},
                    topology={"preferred" if preferred else "required": RACK}, **spec)


def bound(node_name: str, cpu: str = "4", phase: str = "Running", attempt: int = 0, **meta: Any) -> dict[str, Any]:
    return {"metadata": {"labels": {labels.LABEL_ATTEMPT: str(attempt)}, **meta},
            "spec": {"nodeName": node_name, "containers": [{"resources": {"requests": {"cpu": cpu}}}]},
            "status": {"phase": phase}}


NODES = [node("a1", "a"), node("a2", "a"), node("b1", "b"), node("b2", "b"), node("b3", "b"), node("plain", None)]


def test_what_running_pods_hold_is_counted_by_node_and_ended_pods_hold_nothing() -> None:
    used = used_by_node([bound("a1"), bound("a1", cpu="1"), bound("b1", phase="Succeeded"), {"spec": {}}])
    assert used == {"a1": {"pods": Decimal(2), "cpu": Decimal(5)}}


def test_room_counts_whole_pods_on_the_nodes_the_pods_could_use() -> None:
    spec = topology_job()
    assert room_by_domain(spec, NODES, {}) == {"a": 4, "b": 6}
    used = used_by_node([bound("a1", cpu="5")])  # 3 cpu left on a1: no room for a 4-cpu pod
    assert room_by_domain(spec, NODES, used) == {"a": 2, "b": 6}
    tainted = [*NODES[:4], node("b3", "b", taints=(Taint("gpu", "x", "NoSchedule"),))]
    assert room_by_domain(spec, tainted, {})["b"] == 4
    cordoned = [*NODES[:4], node("b3", "b", unschedulable=True)]
    assert room_by_domain(spec, cordoned, {})["b"] == 4
    pinned = topology_job(template={"spec": {"nodeSelector": {"pool": "x"}}})
    pooled = [node("a1", "a", labels={"pool": "x"}), node("b1", "b")]
    assert room_by_domain(pinned, pooled, {}) == {"a": 2}


def test_the_gang_goes_to_the_smallest_domain_that_holds_it_all() -> None:
    spec = topology_job()
    placement = choose_domains(spec, {"a": 4, "b": 6})
    assert placement.domains == ({RACK: "a"},) * 4 and not placement.domains_preferred
    assert choose_domains(spec, {"b": 5, "a": 5}).domains[0] == {RACK: "a"}  # a tie: by name


def test_a_required_topology_no_domain_holds_waits_saying_what_the_best_has() -> None:
    spec = topology_job(pods=8)
    with pytest.raises(NoDomain) as raised:
        choose_domains(spec, {"a": 4, "b": 6})
    assert str(raised.value).startswith(f"no {RACK} domain has room for the gang's 8 pods now: the most is {RACK}=b, "
                                        "with room for 6")
    with pytest.raises(NoDomain, match=f"no node the pods could be scheduled on has the label {RACK}"):
        choose_domains(spec, {})


def test_a_preferred_topology_fills_the_roomiest_domains_first_with_consecutive_pods() -> None:
    spec = topology_job(pods=8, preferred=True)
    placement = choose_domains(spec, {"a": 4, "b": 6, "c": 1})
    assert [d[RACK] for d in placement.domains] == ["b"] * 6 + ["a"] * 2 and placement.domains_preferred
    short = choose_domains(spec, {"a": 3})  # the rest have no preference
    assert [d[RACK] for d in short.domains] == ["a"] * 3
    assert choose_domains(topology_job(preferred=True), {"a": 4, "b": 6}).domains == ({RACK: "a"},) * 4


def test_a_gang_with_pods_running_stays_where_most_of_them_are() -> None:
    spec = topology_job()
    assert choose_domains(spec, {"a": 0, "b": 6}, running=["a", "a", "b"]).domains == ({RACK: "a"},) * 4
    nodes = Nodes(known={n.name: n for n in NODES}, synced=True)
    pods = [bound("a1"), bound("b1", attempt=1), bound("a2", deletionTimestamp="now"), bound("plain"), bound("gone")]
    assert running_domains(pods, 0, nodes, RACK) == ["a"]
