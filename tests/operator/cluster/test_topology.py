"""spec.topology without Kueue, on a real API server and scheduler with kwok's fake nodes labelled
into two racks of two nodes (a label of this test's own): the operator puts a gang in one rack, a
gang no rack holds waits saying so (required) or spans both racks with consecutive pods together
(preferred)."""

from __future__ import annotations

import pytest

from ddp_operator import constants as c
from kube import Jobs, wait_until
from racks import BIG_POD, RACKS, bound_racks

# The racks' room is the fake nodes': the module's tests take turns on one worker.
pytestmark = pytest.mark.xdist_group("fake-racks")


def test_a_gang_goes_to_one_rack_and_one_no_rack_holds_waits_saying_so(jobs: Jobs, rack: str) -> None:
    jobs.create("wide", worldSize=3, gpusPerRank=0, resources=BIG_POD, topology={"required": rack})
    status = wait_until(lambda: (s := jobs.status("wide")).get("reason") == c.REASON_NO_TOPOLOGY_DOMAIN and s, 30,
                        "wide to wait for a rack")
    assert status["phase"] == c.PHASE_PENDING  # type: ignore[index]
    assert f"no {rack} domain has room for the gang's 3 pods now: the most is {rack}=r1, with room for 2" in \
        status["message"]  # type: ignore[index]
    assert jobs.pods("wide", include_deleting=True) == []

    jobs.create("pair", worldSize=2, gpusPerRank=0, resources=BIG_POD, topology={"required": rack})
    assert bound_racks(jobs, "pair", 2) == ["r1", "r1"]  # a tie: the lower value
    assert all(p.spec.node_selector[rack] == "r1" for p in jobs.pods("pair"))
    # The second pair goes to the other rack: the first one's pods hold r1's room now.
    jobs.create("other", worldSize=2, gpusPerRank=0, resources=BIG_POD, topology={"required": rack})
    assert bound_racks(jobs, "other", 2) == ["r2", "r2"]
    jobs.wait_phase("other", c.PHASE_RUNNING)
    assert jobs.status("wide")["reason"] == c.REASON_NO_TOPOLOGY_DOMAIN


def test_a_preferred_topology_spans_racks_with_consecutive_pods_together(jobs: Jobs, rack: str) -> None:
    jobs.create("span", worldSize=3, gpusPerRank=0, resources=BIG_POD, topology={"preferred": rack})
    assert bound_racks(jobs, "span", 3) == ["r1", "r1", "r2"]  # as many as fit in the first, then the next
    for pod in jobs.pods("span"):
        (preference,) = pod.spec.affinity.node_affinity.preferred_during_scheduling_ignored_during_execution
        (expression,) = preference.preference.match_expressions
        assert preference.weight == 100 and expression.key == rack and expression.values == [RACKS[pod.spec.node_name]]
        assert rack not in (pod.spec.node_selector or {})
    jobs.wait_phase("span", c.PHASE_RUNNING)
