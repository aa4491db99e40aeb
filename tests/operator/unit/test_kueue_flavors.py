"""Where Kueue's admission puts an admitted gang's pods: flavors' node labels and tolerations, admission
checks' podSetUpdates, topology assignments, and the conflicts that stop a job from starting."""

from __future__ import annotations

from typing import Any

import pytest

from ddp_operator.kueue.flavors import (
    PREFERRED_TOPOLOGY_ANNOTATION,
    UNCONSTRAINED_TOPOLOGY_ANNOTATION,
    assigned_flavors,
    placement_of,
    topology_domains,
)
from ddp_operator.placement import NOWHERE, PlacementConflict, place

A100_TAINT = {"key": "nvidia.com/gpu", "operator": "Equal", "value": "a100", "effect": "NoSchedule"}
FLAVORS = {
    "a100": {"spec": {"nodeLabels": {"gpu": "a100", "pool": "train"}, "tolerations": [A100_TAINT]}},
    "cpu-pool": {"spec": {"nodeLabels": {"pool": "train"}}},
    "bare": {"spec": {}},
}


def admitted(*assignments: dict[str, Any], checks: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"admission": {"clusterQueue": "cq", "podSetAssignments": list(assignments)}}
    if checks:
        status["admissionChecks"] = checks
    return {"status": status}


def pod(name: str = "job-0", **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"app": "x"}}, "spec": {"containers": [], **spec}}


def test_each_assigned_flavor_is_read_once() -> None:
    workload = admitted({"name": "ranks", "flavors": {"nvidia.com/gpu": "a100", "cpu": "cpu-pool", "memory": "cpu-pool"}},
                        {"name": "data-workers", "flavors": {"cpu": "cpu-pool"}})
    assert assigned_flavors(workload) == ["cpu-pool", "a100"]  # by resource name: cpu, memory, nvidia.com/gpu
    assert assigned_flavors({"status": {}}) == []


def test_a_flavors_node_labels_and_tolerations_go_to_every_pod_of_its_pod_set() -> None:
    workload = admitted({"name": "ranks", "flavors": {"cpu": "cpu-pool", "nvidia.com/gpu": "a100"}})
    placement = placement_of(workload, "ranks", FLAVORS, 2)
    assert placement.node_selector == {"gpu": "a100", "pool": "train"}
    assert placement.tolerations == (A100_TAINT,)
    placed = place(pod(tolerations=[{"key": "spot", "operator": "Exists"}]), placement, 0)
    assert placed["spec"]["nodeSelector"] == {"gpu": "a100", "pool": "train"}
    assert placed["spec"]["tolerations"] == [{"key": "spot", "operator": "Exists"}, A100_TAINT]
    assert placement_of(workload, "data-workers", FLAVORS, 1) == NOWHERE  # a pod set the admission names not


def test_a_toleration_the_pod_has_already_is_not_added_twice() -> None:
    placement = placement_of(admitted({"name": "ranks", "flavors": {"nvidia.com/gpu": "a100"}}), "ranks", FLAVORS, 1)
    same = {k: v for k, v in A100_TAINT.items() if k != "operator"}  # Equal is the default operator
    assert place(pod(tolerations=[same]), placement, 0)["spec"]["tolerations"] == [same]


def test_a_pods_own_node_selector_is_kept_and_the_same_value_is_no_conflict() -> None:
    placement = placement_of(admitted({"name": "ranks", "flavors": {"nvidia.com/gpu": "a100"}}), "ranks", FLAVORS, 1)
    placed = place(pod(nodeSelector={"gpu": "a100", "disk": "ssd"}), placement, 0)
    assert placed["spec"]["nodeSelector"] == {"gpu": "a100", "disk": "ssd", "pool": "train"}


def test_a_pod_that_asks_for_another_value_of_a_flavors_label_is_a_conflict_named_with_both_values() -> None:
    placement = placement_of(admitted({"name": "ranks", "flavors": {"nvidia.com/gpu": "a100"}}), "ranks", FLAVORS, 1)
    with pytest.raises(PlacementConflict) as raised:
        place(pod(nodeSelector={"gpu": "h100"}), placement, 0)
    assert "gpu=a100" in str(raised.value) and "h100" in str(raised.value) and "job-0" in str(raised.value)


def test_admission_checks_updates_are_applied_and_two_that_disagree_are_a_conflict() -> None:
    update = {"name": "ranks", "labels": {"team": "a"}, "annotations": {"checked": "yes"},
              "nodeSelector": {"zone": "z1"}, "tolerations": [{"key": "reserved", "operator": "Exists"}]}
    workload = admitted({"name": "ranks", "flavors": {"cpu": "bare"}},
                        checks=[{"name": "prov", "podSetUpdates": [update, {"name": "data-workers", "labels": {"x": "y"}}]}])
    placed = place(pod(), placement_of(workload, "ranks", FLAVORS, 1), 0)
    assert placed["metadata"]["labels"] == {"app": "x", "team": "a"}
    assert placed["metadata"]["annotations"] == {"checked": "yes"}
    assert placed["spec"]["nodeSelector"] == {"zone": "z1"}
    assert placed["spec"]["tolerations"] == [{"key": "reserved", "operator": "Exists"}]
    workload["status"]["admissionChecks"].append({"name": "other", "podSetUpdates": [{"name": "ranks",
                                                                                      "nodeSelector": {"zone": "z2"}}]})
    with pytest.raises(PlacementConflict, match="admission check other.*zone=z2"):
        placement_of(workload, "ranks", FLAVORS, 1)


def test_nothing_admitted_adds_nothing() -> None:
    assert placement_of({"status": {}}, "ranks", FLAVORS, 2) == NOWHERE


def test_a_flavor_not_read_is_named() -> None:
    with pytest.raises(KeyError, match="gone"):
        placement_of(admitted({"name": "ranks", "flavors": {"cpu": "gone"}}), "ranks", FLAVORS, 1)


def test_a_topology_assignment_puts_the_first_ranks_in_the_first_domain() -> None:
    topology = {"levels": ["rack", "kubernetes.io/hostname"], "slices": [
        {"domainCount": 2, "podCounts": {"individual": [3, 1]},
         "valuesPerLevel": [{"universal": "r1"}, {"individual": {"prefix": "node-", "roots": ["a", "b"]}}]},
        {"domainCount": 1, "podCounts": {"universal": 2},
         "valuesPerLevel": [{"universal": "r2"}, {"individual": {"roots": ["c"], "suffix": "-x"}}]},
    ]}
    domains = topology_domains(topology, 6)
    hosts = [d["kubernetes.io/hostname"] for d in domains]
    assert hosts == ["node-a", "node-a", "node-a", "node-b", "c-x", "c-x"]
    assert [d["rack"] for d in domains] == ["r1"] * 4 + ["r2"] * 2
    with pytest.raises(PlacementConflict, match="places 6 pods, the pod set has 7"):
        topology_domains(topology, 7)


def test_a_pod_placed_by_topology_gets_its_domain_and_says_what_topology_it_asked_for() -> None:
    topology = {"levels": ["rack"], "slices": [{"domainCount": 2, "podCounts": {"universal": 1},
                                                 "valuesPerLevel": [{"individual": {"roots": ["r1", "r2"]}}]}]}
    workload = admitted({"name": "ranks", "flavors": {"cpu": "cpu-pool"}, "topologyAssignment": topology})
    placement = placement_of(workload, "ranks", FLAVORS, 2, (PREFERRED_TOPOLOGY_ANNOTATION, "rack"))
    second = place(pod("job-1"), placement, 1)
    assert second["spec"]["nodeSelector"] == {"pool": "train", "rack": "r2"}
    assert second["metadata"]["annotations"] == {PREFERRED_TOPOLOGY_ANNOTATION: "rack"}
    # Without a topology request of its own it is marked unconstrained, as Kueue marks such pods: else
    # Kueue would count its resources again, as a pod it does not place.
    first = place(pod("job-0"), placement_of(workload, "ranks", FLAVORS, 2), 0)
    assert first["metadata"]["annotations"] == {UNCONSTRAINED_TOPOLOGY_ANNOTATION: "true"}
    with pytest.raises(PlacementConflict, match="rack=r1.*job-0"):
        place(pod("job-0", nodeSelector={"rack": "r9"}), placement, 0)
