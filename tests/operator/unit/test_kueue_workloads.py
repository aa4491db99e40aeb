"""WorkloadCache: our Workloads by job, watched in the namespaces the operator serves, and why they cannot be
seen when they cannot."""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from ddp_contract import labels
from ddp_operator.kueue.workloads import WorkloadCache, slim_workload, unavailable_reason


def api_workload(name: str, job: str | None = "mnist", uid: str = "w1", namespace: str = "ns") -> dict[str, Any]:
    job_labels = {labels.LABEL_JOB_NAME: job} if job else {}
    return {"metadata": {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": "7",
                         "labels": job_labels, "managedFields": [{"manager": "kueue"}]},
            "spec": {"podSets": [{"name": "ranks", "count": 2, "template": {"spec": {"containers": []}}}]},
            "status": {"conditions": [{"type": "Admitted", "status": "True"}], "admission": {"clusterQueue": "cq"}}}


def cache(*namespaces: str) -> tuple[WorkloadCache, list[tuple[str, str]]]:
    seen: list[tuple[str, str]] = []
    return WorkloadCache(client.ApiClient(), seen.append, namespaces=namespaces), seen


def test_workloads_are_kept_slim_by_job() -> None:
    workloads, seen = cache()
    workloads.replace(None, [api_workload("ddpjob-mnist-w1"), api_workload("stranger", job=None)])
    (kept,) = workloads.workloads(("ns", "mnist"))
    assert kept == slim_workload(api_workload("ddpjob-mnist-w1"))
    assert kept["spec"] == {"active": True} and "managedFields" not in kept["metadata"]
    assert kept["status"]["conditions"] == [{"type": "Admitted", "status": "True"}]
    assert kept["status"]["admission"] == {"clusterQueue": "cq"}  # where the pods go
    assert seen == [("ns", "mnist")]


def test_the_slim_workload_keeps_the_admission_checks_updates_only() -> None:
    workload = api_workload("ddpjob-mnist-w1")
    update = {"name": "ranks", "nodeSelector": {"zone": "a"}}
    workload["status"]["admissionChecks"] = [
        {"name": "prov", "state": "Ready", "message": "ok", "podSetUpdates": [update]},
        {"name": "plain", "state": "Ready", "message": "ok"}]
    assert slim_workload(workload)["status"]["admissionChecks"] == [{"name": "prov", "podSetUpdates": [update]}]


def test_a_deleted_workload_is_forgotten_and_its_job_told() -> None:
    workloads, seen = cache()
    workloads.apply("ADDED", api_workload("ddpjob-mnist-old", uid="old"))
    workloads.apply("ADDED", api_workload("ddpjob-mnist-new", uid="new"))
    workloads.apply("DELETED", api_workload("ddpjob-mnist-old", uid="old"))
    assert [w["metadata"]["uid"] for w in workloads.workloads(("ns", "mnist"))] == ["new"]
    assert seen == [("ns", "mnist")] * 3


def test_named_namespaces_are_watched_each_apart_like_the_pods() -> None:
    workloads, seen = cache("team-a", "team-b")
    assert [w.namespace for w in workloads._watches] == ["team-a", "team-b"]
    workloads.replace("team-a", [api_workload("ddpjob-mnist-a", namespace="team-a")])
    workloads.replace("team-b", [api_workload("ddpjob-mnist-b", namespace="team-b")])
    workloads.replace("team-a", [])
    assert workloads.workloads(("team-a", "mnist")) == []
    assert len(workloads.workloads(("team-b", "mnist"))) == 1, "team-b's Workloads stay when team-a is listed again"
    assert seen[-1] == ("team-a", "mnist")


def test_globs_watch_the_cluster_and_keep_the_matching_namespaces_workloads() -> None:
    workloads, seen = cache("t-12ab-*")
    assert [w.namespace for w in workloads._watches] == [None]
    workloads.replace(None, [api_workload("ddpjob-mnist-1", namespace="t-12ab-one"),
                             api_workload("ddpjob-mnist-2", namespace="t-99zz-two")])
    assert len(workloads.workloads(("t-12ab-one", "mnist"))) == 1 and workloads.workloads(("t-99zz-two", "mnist")) == []
    assert ("t-99zz-two", "mnist") not in seen


def test_each_namespace_is_seen_once_its_own_watch_has_listed_and_an_error_is_told_until_then() -> None:
    workloads, _ = cache("team-a", "team-b")
    first, second = workloads._watches
    assert workloads.unavailable("team-a") == "listing Kueue's Workloads"
    second.last_error = ApiException(status=403, reason="Forbidden")
    first.synced.set()
    assert workloads.synced_in("team-a") and workloads.unavailable("team-a") is None
    assert not workloads.synced_in("team-b")
    assert str(workloads.unavailable("team-b")).startswith("Kueue's Workloads cannot be listed: 403 Forbidden; ")
    second.last_error = None
    second.synced.set()
    assert workloads.unavailable("team-b") is None


def test_one_cluster_wide_watch_answers_for_every_namespace() -> None:
    workloads, _ = cache()
    (watch,) = workloads._watches
    watch.last_error = ApiException(status=404, reason="Not Found")
    assert workloads.error_in("anywhere") is watch.last_error
    assert "is not served" in str(workloads.unavailable("anywhere"))


def test_unavailable_reason() -> None:
    assert unavailable_reason(False, None) == "listing Kueue's Workloads"
    assert "is not served: install Kueue" in str(unavailable_reason(False, ApiException(status=404, reason="Not Found")))
    refused = unavailable_reason(False, ApiException(status=403, reason="Forbidden"))
    assert refused == ("Kueue's Workloads cannot be listed: 403 Forbidden; the operator's ServiceAccount needs get, list, "
                       "watch, create and patch on workloads.kueue.x-k8s.io (the chart's RBAC grants them)")
    assert unavailable_reason(False, ApiException(status=500, reason="Internal Server Error")) == \
        "Kueue's Workloads cannot be listed: 500 Internal Server Error"
    assert unavailable_reason(True, ApiException(status=403, reason="Forbidden")) is None
