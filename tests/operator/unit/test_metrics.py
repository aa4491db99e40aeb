"""The metrics' pure parts: what an API request was, what a recorded status says happened, the jobs' gauges."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import REGISTRY

from ddp_operator import constants as c
from ddp_operator import metrics
from ddp_operator.workqueue import WorkQueue

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize("method, path, query, expected", [
    ("GET", "/api/v1/namespaces/a/pods", [("watch", True), ("labelSelector", "x")], ("watch", "pods")),
    ("GET", "/api/v1/pods", [("labelSelector", "x")], ("list", "pods")),
    ("GET", "/api/v1/namespaces/a/pods/train-0", None, ("get", "pods")),
    ("POST", "/api/v1/namespaces/a/pods", None, ("create", "pods")),
    ("DELETE", "/api/v1/namespaces/a/pods/train-0", None, ("delete", "pods")),
    ("DELETE", "/api/v1/namespaces/a/pods", None, ("deletecollection", "pods")),
    ("PATCH", "/apis/ddpoperator.io/v1alpha1/namespaces/a/ddpjobs/train/status", None, ("patch", "ddpjobs/status")),
    ("PUT", "/apis/coordination.k8s.io/v1/namespaces/ops/leases/ddp-operator", None, ("update", "leases")),
    ("GET", "/api/v1/nodes", [("watch", "true")], ("watch", "nodes")),
    ("GET", "/api/v1/namespaces/a", None, ("get", "namespaces")),
    ("GET", "/api/v1/namespaces", None, ("list", "namespaces")),
    ("GET", "/apis", None, ("list", "discovery")),
])
def test_a_request_is_named_by_its_kubernetes_verb_and_resource(method: str, path: str, query: Any,
                                                                  expected: tuple[str, str]) -> None:
    assert metrics.request_labels(method, path, query) == expected


def test_a_new_restart_is_counted_with_its_reason_and_kind_and_a_repeated_patch_is_not() -> None:
    patch = {"restarts": 2, "reason": c.REASON_NODE_LOST, "failedRank": {"kind": c.KIND_INFRASTRUCTURE}}
    assert metrics.restart_recorded({"restarts": 1}, patch) == (c.REASON_NODE_LOST, c.KIND_INFRASTRUCTURE)
    assert metrics.restart_recorded({"restarts": 2}, patch) is None
    assert metrics.restart_recorded({}, {"restarts": 0, "phase": c.PHASE_RUNNING}) is None


def job(created: datetime, **status: Any) -> dict[str, Any]:
    return {"metadata": {"namespace": "team-a", "name": "train", "creationTimestamp": created.strftime("%Y-%m-%dT%H:%M:%SZ")},
            "status": status}


def test_time_to_running_is_taken_at_the_first_running_only() -> None:
    created = NOW - timedelta(seconds=42)
    running = {"phase": c.PHASE_RUNNING}
    assert metrics.first_running_after(job(created), {"phase": c.PHASE_STARTING}, running, NOW) == 42
    assert metrics.first_running_after(job(created), {}, running, NOW) == 42
    assert metrics.first_running_after(job(created), running, running, NOW) is None
    # After a gang restart the Running condition is still there (False): not the first time.
    restarted = {"phase": c.PHASE_RESTARTING, "conditions": [{"type": c.COND_RUNNING, "status": "False"}]}
    assert metrics.first_running_after(job(created), restarted, running, NOW) is None
    assert metrics.first_running_after(job(created), {}, {"phase": c.PHASE_STARTING}, NOW) is None


def test_status_recorded_moves_the_counters() -> None:
    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    labels = {"reason": c.REASON_HUNG, "kind": c.KIND_INFRASTRUCTURE}
    restarts, firsts = sample("ddp_operator_gang_restarts_total", **labels), sample("ddp_operator_time_to_running_seconds_count")
    metrics.status_recorded(job(NOW), {"restarts": 0}, {"restarts": 1, "reason": c.REASON_HUNG, "phase": c.PHASE_RESTARTING,
                                                      "failedRank": {"kind": c.KIND_INFRASTRUCTURE}}, NOW)
    metrics.status_recorded(job(NOW - timedelta(seconds=3)), {}, {"phase": c.PHASE_RUNNING}, NOW)
    assert sample("ddp_operator_gang_restarts_total", **labels) == restarts + 1
    assert sample("ddp_operator_time_to_running_seconds_count") == firsts + 1


def samples(families: list[Any]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for family in families for s in family.samples}


def test_jobs_are_counted_by_phase_and_rank_zeros_progress_exported_while_running() -> None:
    progress = {"samplesPerSecond": 812.5, "stepSeconds": 0.2, "step": 10}
    jobs = [job(NOW, phase=c.PHASE_RUNNING, progress=progress), job(NOW, phase=c.PHASE_RUNNING),
            job(NOW, phase=c.PHASE_SUCCEEDED, progress=progress), job(NOW)]
    jobs[1]["metadata"]["name"] = "other"
    found = samples(metrics.job_families(jobs))
    by_phase = {dict(labels)["phase"]: value for (name, labels), value in found.items() if name == "ddp_operator_jobs"}
    assert by_phase == {**dict.fromkeys(c.PHASES, 0), c.PHASE_RUNNING: 2, c.PHASE_SUCCEEDED: 1, c.PHASE_PENDING: 1}
    key = (("name", "train"), ("namespace", "team-a"))
    # Only the Running job that reported: a finished job's last rate is not its throughput now.
    assert {k: v for k, v in found.items() if k[0].startswith("ddp_operator_job_")} == {
        ("ddp_operator_job_samples_per_second", key): 812.5, ("ddp_operator_job_step_seconds", key): 0.2}


def test_no_jobs_still_says_zero_for_every_phase() -> None:
    found = samples(metrics.job_families([]))
    assert sorted(dict(labels)["phase"] for (name, labels) in found if name == "ddp_operator_jobs") == sorted(c.PHASES)


def test_a_work_queue_reports_its_depth_its_passes_and_their_errors() -> None:
    def sample(name: str) -> float:
        return REGISTRY.get_sample_value(name, {"queue": "unit"}) or 0.0

    async def scenario() -> tuple[float, float]:
        async def reconcile(key: str) -> None:
            if key == "bad":
                raise RuntimeError("boom")

        queue: WorkQueue[str] = WorkQueue(reconcile, workers=1, name="unit")
        queue.add("good")
        queue.add("bad")
        depth = sample("ddp_operator_workqueue_depth")
        queue.start()
        while sample("ddp_operator_reconcile_seconds_count") < passes + 2:
            await asyncio.sleep(0.01)
        await queue.stop()
        return depth, sample("ddp_operator_workqueue_depth")

    passes, errors = sample("ddp_operator_reconcile_seconds_count"), sample("ddp_operator_reconcile_errors_total")
    assert asyncio.run(asyncio.wait_for(scenario(), 10)) == (2, 0)
    assert sample("ddp_operator_reconcile_errors_total") == errors + 1


def test_counters_whose_labels_are_known_are_served_at_zero_before_their_first_increment() -> None:
    """A series that first appears at 1 hides that increment from rate() and increase(): the dashboard's
    error and deletion panels would miss a queue's first error and the first pods deleted."""
    async def reconcile(key: str) -> None:
        return None

    WorkQueue(reconcile, workers=1, name="unit-fresh")
    assert REGISTRY.get_sample_value("ddp_operator_reconcile_errors_total", {"queue": "unit-fresh"}) == 0
    for forced in ("false", "true"):
        assert REGISTRY.get_sample_value("ddp_operator_pods_deleted_total", {"forced": forced}) is not None
