"""The node watch's cache: only news reaches the jobs, and deleted nodes are remembered."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from kubernetes import client

from ddp_operator.nodewatch import FORGET_DELETED_AFTER, NodeCache
from podfixtures import api_node


def cache() -> tuple[NodeCache, list[set[str]]]:
    seen: list[set[str]] = []
    return NodeCache(client.ApiClient(), seen.append), seen


def heartbeat(node: dict[str, Any]) -> dict[str, Any]:
    node["status"]["conditions"][1]["lastHeartbeatTime"] = "2030-01-01T00:00:00Z"
    return node


def test_a_list_then_only_changes_that_matter_are_told() -> None:
    nodes, seen = cache()
    nodes._replace([api_node("gpu-0"), api_node("gpu-1")])
    assert seen == [{"gpu-0", "gpu-1"}] and nodes.snapshot().synced is False  # synced is the list loop's to set
    nodes._apply("MODIFIED", heartbeat(api_node("gpu-0")))
    assert seen == [{"gpu-0", "gpu-1"}], "a heartbeat is no news"
    nodes._apply("MODIFIED", api_node("gpu-0", "Unknown"))
    assert seen[-1] == {"gpu-0"} and nodes.snapshot().known["gpu-0"].ready == "Unknown"


def test_a_deleted_node_is_remembered_until_it_comes_back() -> None:
    nodes, seen = cache()
    nodes._replace([api_node("gpu-0"), api_node("gpu-1")])
    taken = nodes.snapshot()
    nodes._apply("DELETED", api_node("gpu-1"))
    assert seen[-1] == {"gpu-1"} and "gpu-1" in nodes.snapshot().deleted and "gpu-1" not in nodes.snapshot().known
    assert "gpu-1" in taken.known, "a snapshot stays as it was taken"
    nodes._apply("ADDED", api_node("gpu-1"))
    assert "gpu-1" not in nodes.snapshot().deleted


def test_nodes_gone_between_two_lists_count_as_deleted_for_a_while() -> None:
    nodes, seen = cache()
    nodes._replace([api_node("gpu-0"), api_node("gpu-1")])
    nodes._replace([api_node("gpu-0")])
    assert seen[-1] == {"gpu-1"} and set(nodes.snapshot().deleted) == {"gpu-1"}
    nodes._deleted = {"gpu-1": nodes._deleted["gpu-1"] - FORGET_DELETED_AFTER - timedelta(seconds=1)}
    nodes._apply("MODIFIED", api_node("gpu-0", "False"))
    assert nodes.snapshot().deleted == {}
