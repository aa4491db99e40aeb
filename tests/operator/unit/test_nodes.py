"""Nodes as the operator judges them: lost (NotReady past the grace, deleted), schedulable, and whether a gang fits."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from ddp_contract.timestamps import rfc3339
from ddp_operator import constants as c
from ddp_operator.capacity import MAX_QUANTITY, gang_too_large, parse_quantity, rank_requests
from ddp_operator.nodes import Nodes, Taint, lost_nodes, node_info, schedulable_for, seconds_until_lost, tolerates
from ddp_operator.spec import MAX_SECONDS
from podfixtures import NOW, api_node, job_spec


def view(*nodes: dict[str, Any], deleted: dict[str, Any] | None = None, synced: bool = True) -> Nodes:
    known = {info.name: info for info in map(node_info, nodes)}
    return Nodes(known, deleted or {}, synced)


def test_node_info_keeps_what_is_judged_and_not_heartbeats() -> None:
    info = node_info(api_node("gpu-0", taints=[{"key": "k", "effect": "NoSchedule"}], labels={"zone": "a"}))
    assert (info.name, info.ready, info.ready_reason) == ("gpu-0", "True", "KubeletReady")
    assert info.ready_since == NOW - timedelta(hours=1)
    assert info.taints == (Taint("k", "", "NoSchedule"),) and info.labels == {"zone": "a"}
    assert info.allocatable["nvidia.com/gpu"] == "8"
    later = api_node("gpu-0", taints=[{"key": "k", "effect": "NoSchedule"}], labels={"zone": "a"})
    later["status"]["conditions"][1]["lastHeartbeatTime"] = rfc3339(NOW + timedelta(minutes=5))
    assert node_info(later) == info, "a heartbeat alone is no news"


def test_a_node_not_ready_is_lost_once_the_grace_has_passed() -> None:
    since = NOW - timedelta(seconds=30)
    nodes = view(api_node("gpu-0"), api_node("gpu-1", "Unknown", since, reason="NodeStatusUnknown"),
                 api_node("gpu-2", "False", since, reason="KubeletNotReady"))
    assert lost_nodes(["gpu-0", "gpu-1", "gpu-2"], nodes, 60, NOW) == {}
    assert seconds_until_lost(["gpu-0", "gpu-1"], nodes, 60, NOW) == 30
    lost = lost_nodes(["gpu-0", "gpu-1", "gpu-2"], nodes, 30, NOW)
    assert lost == {
        "gpu-1": f"node gpu-1 NotReady since {rfc3339(since)} (Ready Unknown: NodeStatusUnknown)",
        "gpu-2": f"node gpu-2 NotReady since {rfc3339(since)} (Ready False: KubeletNotReady)",
    }
    assert seconds_until_lost(["gpu-0", "gpu-1"], nodes, 30, NOW) is None, "lost already: nothing left to wait for"
    assert lost_nodes(["gpu-0"], nodes, 0, NOW) == {}, "a Ready node is never lost"


def test_a_deleted_node_is_lost_at_once_and_one_never_seen_is_not_judged() -> None:
    nodes = view(api_node("gpu-0"), deleted={"gpu-9": NOW - timedelta(seconds=1)})
    assert lost_nodes(["gpu-9", "gpu-7"], nodes, 300, NOW) == {
        "gpu-9": f"node gpu-9 was deleted at {rfc3339(NOW - timedelta(seconds=1))}"}


def test_nothing_is_judged_before_the_nodes_are_listed() -> None:
    nodes = view(api_node("gpu-1", "Unknown", NOW - timedelta(hours=1)), deleted={"gpu-9": NOW}, synced=False)
    assert lost_nodes(["gpu-1", "gpu-9"], nodes, 0, NOW) == {}
    assert gang_too_large(job_spec(worldSize=100, gpusPerRank=8), []) is None


@pytest.mark.parametrize("toleration, taint, expected", [
    ({"key": "k", "operator": "Exists"}, Taint("k", "v", "NoSchedule"), True),
    ({"key": "k", "value": "v"}, Taint("k", "v", "NoExecute"), True),
    ({"key": "k", "operator": "Equal", "value": "w"}, Taint("k", "v", "NoSchedule"), False),
    ({"key": "k", "operator": "Exists", "effect": "NoExecute"}, Taint("k", "", "NoSchedule"), False),
    ({"operator": "Exists"}, Taint("anything", "x", "NoExecute"), True),
    ({"operator": "Exists", "effect": "NoSchedule"}, Taint("anything", "", "NoExecute"), False),
    ({"key": "other", "operator": "Exists"}, Taint("k", "", "NoSchedule"), False),
])
def test_tolerations_match_taints_as_the_scheduler_does(toleration: dict, taint: Taint, expected: bool) -> None:
    assert tolerates([toleration], taint) is expected


def test_a_node_is_schedulable_for_a_pod_if_ready_uncordoned_selected_and_its_taints_tolerated() -> None:
    def usable(node: dict[str, Any], selector: dict[str, str] | None = None, tolerations: list | None = None) -> bool:
        return schedulable_for(node_info(node), selector or {}, tolerations or [])

    assert usable(api_node("a"))
    assert not usable(api_node("a", "Unknown"))
    assert not usable(api_node("a", unschedulable=True))
    assert usable(api_node("a", labels={"pool": "h100"}), {"pool": "h100"})
    assert not usable(api_node("a", labels={"pool": "a100"}), {"pool": "h100"})
    gpu_only = [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]
    assert not usable(api_node("a", taints=gpu_only))
    assert usable(api_node("a", taints=gpu_only), tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}])
    assert usable(api_node("a", taints=[{"key": "k", "effect": "PreferNoSchedule"}])), "only a preference"


@pytest.mark.parametrize("text, value", [
    ("8", Decimal(8)), (8, Decimal(8)), ("500m", Decimal("0.5")), ("64Gi", Decimal(64 * 2**30)),
    ("1.5", Decimal("1.5")), ("2k", Decimal(2000)), ("1e3", Decimal(1000)), ("128M", Decimal(128_000_000)),
    ("lots", None), ("", None), ("2Ei", Decimal(2 * 2**60)), ("3E", Decimal(3 * 10**18)),
    # Capped at int64's maximum, as the API server's resource.Quantity is: no sum or product of them overflows.
    ("1e999999999", MAX_QUANTITY), ("99999999999Ei", MAX_QUANTITY), (2**64, MAX_QUANTITY), ("-1e999999999", -MAX_QUANTITY),
])
def test_quantities_are_read_as_the_api_writes_them(text: Any, value: Decimal | None) -> None:
    assert parse_quantity(text) == value


def test_a_ranks_requests_are_its_gpus_and_every_containers_cpu_and_memory() -> None:
    spec = job_spec(gpusPerRank=2, resources={"limits": {"cpu": "8", "memory": "32Gi"}, "requests": {"cpu": "4"}},
                    template={"spec": {"containers": [{"name": "logger", "image": "fluent-bit:3",
                                                       "resources": {"requests": {"cpu": "500m"}}}]}})
    assert rank_requests(spec) == {c.GPU_RESOURCE: 2, "cpu": Decimal("4.5"), "memory": 32 * 2**30}
    assert rank_requests(job_spec(gpusPerRank=0)) == {}


FOUR_NODES = [node_info(api_node(f"gpu-node-{i}")) for i in range(4)]


def test_a_gang_that_fits_is_not_too_large() -> None:
    assert gang_too_large(job_spec(worldSize=32, gpusPerRank=1), FOUR_NODES) is None
    assert gang_too_large(job_spec(worldSize=4, gpusPerRank=8), FOUR_NODES) is None


def test_a_gang_needing_more_gpus_than_the_cluster_has_in_all_is_too_large() -> None:
    assert gang_too_large(job_spec(worldSize=32, gpusPerRank=2), FOUR_NODES) == (
        "needs 64 nvidia.com/gpu (32 ranks x 2); the cluster's 4 schedulable nodes have 32 in all")


def test_a_rank_needing_more_than_any_one_node_has_is_too_large() -> None:
    assert gang_too_large(job_spec(worldSize=2, gpusPerRank=16), FOUR_NODES) == (
        "each rank needs 16 nvidia.com/gpu; the largest of the cluster's 4 schedulable nodes has 8")
    memory = job_spec(worldSize=1, gpusPerRank=0, resources={"requests": {"memory": "600Gi"}})
    assert gang_too_large(memory, FOUR_NODES) == (
        "each rank needs 600Gi memory; the largest of the cluster's 4 schedulable nodes has 512Gi")


def test_only_the_nodes_a_rank_could_use_count() -> None:
    nodes = [*FOUR_NODES[:2], node_info(api_node("down", "Unknown")), node_info(api_node("cordoned", unschedulable=True)),
             node_info(api_node("tainted", taints=[{"key": "dedicated", "value": "infer", "effect": "NoSchedule"}]))]
    assert gang_too_large(job_spec(worldSize=3, gpusPerRank=8), nodes) == (
        "needs 24 nvidia.com/gpu (3 ranks x 8); the cluster's 2 schedulable nodes have 16 in all")
    tolerant = {"spec": {"tolerations": [{"key": "dedicated", "operator": "Exists"}]}}
    assert gang_too_large(job_spec(worldSize=3, gpusPerRank=8, template=tolerant), nodes) is None
    pinned = [node_info(api_node("h100-0", labels={"pool": "h100"})), *FOUR_NODES]
    selected = job_spec(worldSize=2, gpusPerRank=8, template={"spec": {"nodeSelector": {"pool": "h100"}}})
    assert gang_too_large(selected, pinned) == (
        "needs 16 nvidia.com/gpu (2 ranks x 8); the 1 schedulable node matching its nodeSelector has 8 in all")


def test_no_usable_node_at_all_is_left_to_the_schedulers_words() -> None:
    spec = job_spec(worldSize=2, gpusPerRank=8, template={"spec": {"nodeSelector": {"pool": "none"}}})
    assert gang_too_large(spec, FOUR_NODES) is None


def test_the_longest_grace_is_counted_without_leaving_the_calendar() -> None:
    """nodeLostGraceSeconds at its limit for a node NotReady since the year 9990: not lost, and the wait is counted."""
    late = datetime(9990, 1, 1, tzinfo=UTC)
    nodes = view(api_node("gpu-1", "False", late))
    assert lost_nodes(["gpu-1"], nodes, MAX_SECONDS, late + timedelta(seconds=1)) == {}
    assert seconds_until_lost(["gpu-1"], nodes, MAX_SECONDS, late + timedelta(seconds=1)) == MAX_SECONDS - 1


def test_a_gang_asking_past_every_bound_is_too_large_in_words() -> None:
    """A sidecar's resources are the template's, kept as written (the API server judges them in the pod)."""
    sidecar = {"name": "side", "image": "busybox", "resources": {"requests": {"cpu": "1e99"}}}
    spec = job_spec(worldSize=4, gpusPerRank=0, template={"spec": {"containers": [sidecar]}})
    said = gang_too_large(spec, [node_info(api_node("cpu-0"))])
    assert said is not None and said.startswith("each rank needs 9.22337e+18 cpu"), said
