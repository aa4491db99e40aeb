"""The pod watch's cache: a relist of one namespace replaces that namespace's pods only; globs filter."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from ddp_operator.heap import RELEASE_AFTER
from ddp_operator.listwatch import watch_scopes
from ddp_operator.podstate import PodView, rank_problem
from ddp_operator.podwatch import PodCache, slim_pod
from podfixtures import JOB, pod


def in_namespace(namespace: str, rank: int) -> dict[str, Any]:
    made = pod(rank)
    made["metadata"]["namespace"] = namespace
    return made


def cache(*namespaces: str) -> tuple[PodCache, list[tuple[str, str]]]:
    seen: list[tuple[str, str]] = []
    return PodCache(client.ApiClient(), seen.append, namespaces=namespaces), seen


def test_named_namespaces_get_a_watch_each_and_a_relist_of_one_leaves_the_others() -> None:
    pods, seen = cache("team-a", "team-b")
    assert [w.namespace for w in pods._watches] == ["team-a", "team-b"]
    pods.replace("team-a", [in_namespace("team-a", 0), in_namespace("team-a", 1)])
    pods.replace("team-b", [in_namespace("team-b", 0)])
    pods.replace("team-a", [in_namespace("team-a", 1)])
    assert [p["metadata"]["name"] for p in pods.pods(("team-a", JOB))] == [f"{JOB}-1"]
    assert len(pods.pods(("team-b", JOB))) == 1, "team-b's pods stay when team-a is listed again"
    assert seen[-1] == ("team-a", JOB)


def test_everywhere_is_one_cluster_wide_watch_whose_relist_replaces_all() -> None:
    pods, _ = cache()
    assert [w.namespace for w in pods._watches] == [None]
    pods.replace(None, [in_namespace("team-a", 0), in_namespace("team-b", 0)])
    pods.replace(None, [in_namespace("team-b", 0)])
    assert pods.pods(("team-a", JOB)) == [] and len(pods.pods(("team-b", JOB))) == 1


def test_globs_watch_the_cluster_and_keep_the_matching_namespaces_pods() -> None:
    pods, seen = cache("t-12ab-*")
    assert [w.namespace for w in pods._watches] == [None]
    pods.replace(None, [in_namespace("t-12ab-one", 0), in_namespace("t-99zz-two", 0)])
    pods.apply("ADDED", in_namespace("t-99zz-two", 1))
    pods.apply("ADDED", in_namespace("t-12ab-one", 1))
    assert len(pods.pods(("t-12ab-one", JOB))) == 2 and pods.pods(("t-99zz-two", JOB)) == []
    assert ("t-99zz-two", JOB) not in seen


def test_watch_scopes_name_each_exact_namespace_else_the_whole_cluster_with_its_globs() -> None:
    assert watch_scopes(()) == ((None,), ())
    assert watch_scopes(("team-a", "team-b")) == (("team-a", "team-b"), ())
    assert watch_scopes(("team-a", "t-*")) == ((None,), ("team-a", "t-*"))


def test_the_cache_keeps_what_a_held_up_rank_is_said_with() -> None:
    pods, _ = cache("team-a")
    raw = pod(0, "pending", waiting="ErrImagePull", waiting_message="401 Unauthorized")
    raw["metadata"]["namespace"] = "team-a"
    resources = {"requests": {"cpu": "2"}}
    raw["spec"] = {"nodeName": "n1", "imagePullSecrets": [{"name": "regcred"}],
                   "containers": [{"name": "trainer", "image": "x", "resources": resources}, {"name": "sidecar"}]}
    pods.replace("team-a", [raw])
    kept = pods.pods(("team-a", JOB))[0]
    # The containers' resources: what the pod holds on its node (spec.topology's room).
    assert kept["spec"] == {"nodeName": "n1", "imagePullSecrets": [{"name": "regcred"}],
                            "containers": [{"resources": resources}]}
    problem = rank_problem(kept, 0)
    assert problem is not None and problem.message.startswith("401 Unauthorized (imagePullSecrets: regcred;")


def test_the_cache_keeps_a_scheduler_of_the_pod_s_own_and_when_the_pod_was_made_only_then() -> None:
    raw = pod(0, "pending")
    raw["metadata"]["creationTimestamp"] = "2025-01-02T03:00:00Z"
    assert "schedulerName" not in slim_pod({**raw, "spec": {"schedulerName": "default-scheduler"}})["spec"]
    assert "creationTimestamp" not in slim_pod(raw)["metadata"]
    kept = slim_pod({**raw, "spec": {"schedulerName": "volcano"}})
    assert kept["spec"]["schedulerName"] == "volcano" and kept["metadata"]["creationTimestamp"] == "2025-01-02T03:00:00Z"


def test_a_pods_reading_is_kept_until_the_pod_changes() -> None:
    pods, _ = cache("team-a")
    pods.replace("team-a", [in_namespace("team-a", 0), in_namespace("team-a", 1)])
    first = {p["metadata"]["name"]: PodView.of(p) for p in pods.pods(("team-a", JOB))}
    again = {p["metadata"]["name"]: PodView.of(p) for p in pods.pods(("team-a", JOB))}
    assert len(first) == 2 and all(again[name] is view for name, view in first.items())

    failed = pod(1, "failed", exit_code=1)
    failed["metadata"]["namespace"] = "team-a"
    pods.apply("MODIFIED", failed)
    views = {p["metadata"]["name"]: PodView.of(p) for p in pods.pods(("team-a", JOB))}
    assert views[f"{JOB}-0"] is first[f"{JOB}-0"]
    assert views[f"{JOB}-1"] is not first[f"{JOB}-1"] and views[f"{JOB}-1"].state == "failed"


def test_a_pod_that_is_not_the_caches_is_read_every_time() -> None:
    plain = pod(0)
    assert PodView.of(plain) is not PodView.of(plain)


def test_the_cache_counts_its_pods_and_releases_memory_once_a_big_gang_is_gone() -> None:
    pods, _ = cache()
    gang = [in_namespace("team-a", rank) for rank in range(2 * RELEASE_AFTER)]
    pods.replace(None, gang[:10])
    for made in gang:
        pods.apply("ADDED", made)  # the first ten again: counted once
    assert pods._count == len(gang)
    for made in gang[:RELEASE_AFTER - 1]:
        pods.apply("DELETED", made)
    assert pods._shrinkage.peak == len(gang), "not yet half gone"
    pods.apply("DELETED", gang[RELEASE_AFTER - 1])
    pods.apply("DELETED", gang[RELEASE_AFTER - 1])  # a second word of the same deletion
    assert pods._count == RELEASE_AFTER
    assert pods._shrinkage.peak == RELEASE_AFTER, "released at half, and judged from there on"
