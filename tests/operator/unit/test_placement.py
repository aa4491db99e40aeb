"""placement.place: what a placement adds to a pod, kept apart from what the pod asks for itself."""

from __future__ import annotations

from typing import Any

import pytest

from ddp_operator.placement import NOWHERE, Placement, PlacementConflict, place


def pod(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "job-0"}, "spec": {"containers": [], **spec}}


def test_nothing_to_add_leaves_the_pod_as_it_is() -> None:
    assert place(pod(), NOWHERE, 0) == pod()
    assert Placement() == NOWHERE and Placement(node_selector={"a": "b"}) != NOWHERE


def test_a_required_domain_is_a_node_selector_and_a_preferred_one_a_node_affinity_preference() -> None:
    domains = ({"rack": "r1"}, {"rack": "r2"})
    required = place(pod(nodeSelector={"disk": "ssd"}), Placement(domains=domains), 1)
    assert required["spec"]["nodeSelector"] == {"disk": "ssd", "rack": "r2"}
    own = {"weight": 5, "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}}
    with_own = pod(affinity={"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [own]}})
    preferred = place(with_own, Placement(domains=domains, domains_preferred=True), 0)
    assert "nodeSelector" not in preferred["spec"]
    assert preferred["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == [
        own, {"weight": 100, "preference": {"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r1"]}]}}]
    assert with_own["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == [own]


def test_a_pod_past_the_domains_has_no_preference() -> None:
    placed = place(pod(), Placement(domains=({"rack": "r1"},), domains_preferred=True, labels={"a": "b"}), 1)
    assert "affinity" not in placed["spec"] and placed["metadata"]["labels"] == {"a": "b"}


def test_a_domain_the_template_contradicts_is_a_conflict() -> None:
    with pytest.raises(PlacementConflict, match="rack=r1.*job-0's template"):
        place(pod(nodeSelector={"rack": "r7"}), Placement(domains=({"rack": "r1"},)), 0)


def test_the_first_pod_of_each_domain_stands_for_its_domain() -> None:
    from ddp_operator.placement import first_of_each_domain

    domains = ({"rack": "r1"}, {"rack": "r1"}, {"rack": "r2"}, {"rack": "r1"}, {"rack": "r2"})
    assert first_of_each_domain(Placement(domains=domains), [1, 2, 3, 4, 5, 6]) == [1, 2, 5]  # 5, 6: no domain
    assert first_of_each_domain(NOWHERE, list(range(10_000))) == [0]
    conflicting = Placement(domains=domains)
    with pytest.raises(PlacementConflict):  # what a domain's first pod is refused, all of its pods are
        place(pod(nodeSelector={"rack": "r1"}), conflicting, 2)
