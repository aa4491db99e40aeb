"""The operator's /metrics, scraped while jobs run, and an operator that watches one namespace only.

Each test runs an operator of its own that watches only the test's namespace, with the session's
operator stopped meanwhile, so the numbers are this operator's and these jobs' alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ddp_contract import api
from ddp_operator import constants as c
from ddp_operator.config import ENV_NAMESPACES
from kube import Cluster, Jobs, OperatorProcess, another_operator_acts, glob_for, wait_until

P = "ddp_operator_"


@pytest.fixture
def session_operator_stopped(operator: OperatorProcess) -> Iterator[None]:
    """The session's cluster-wide operator would act on these jobs too: stopped for the test."""
    operator.stop()
    yield
    operator.restart()


@pytest.fixture
def scoped(cluster: Cluster, crd: None, kube_api, namespace: str, session_operator_stopped: None,
           tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[OperatorProcess]:
    """Serves the test's namespace, named exactly or (param "glob") by a glob matching it alone."""
    if another_operator_acts(kube_api, namespace):
        pytest.skip("another test session's operator serves every namespace of this cluster: these counts would be shared")
    served = glob_for(namespace) if getattr(request, "param", "exact") == "glob" else namespace
    handle = OperatorProcess(cluster.kubeconfig, tmp_path / "operator.log", env={ENV_NAMESPACES: served})
    handle.start()
    yield handle
    handle.stop()
    assert "Traceback" not in handle.log_path.read_text(), handle.log_path.read_text()[-5000:]


def test_metrics_move_as_a_job_runs_restarts_and_goes(kube_api, namespace: str, scoped: OperatorProcess) -> None:
    jobs = Jobs(kube_api, namespace)
    before = scoped.metrics()

    def delta(name: str, **labels: str) -> float:
        return scoped.metric(name, **labels) - before.get((name, frozenset(labels.items())), 0.0)

    assert scoped.metric(P + "leader") == 1  # no election: it acts
    jobs.create("metered", worldSize=3, backoffLimit=2)
    jobs.wait_phase("metered", c.PHASE_RUNNING)
    wait_until(lambda: scoped.metric(P + "jobs", phase=c.PHASE_RUNNING) == 1, 10, "one job Running in the metrics")
    assert delta(P + "pods_created_total") == 3
    assert delta(P + "time_to_running_seconds_count") == 1
    assert delta(P + "api_requests_total", verb="create", resource="pods", code="201") == 3
    assert delta(P + "api_requests_total", verb="patch", resource="ddpjobs/status", code="200") >= 1
    assert delta(P + "reconcile_seconds_count", queue="status") >= 1
    assert delta(P + "reconcile_seconds_count", queue="creation") >= 1
    assert scoped.metric(P + "workqueue_depth", queue="status") >= 0

    # Rank 0's progress, as the trainer writes it, comes out per job.
    jobs.custom.patch_namespaced_custom_object_status(
        api.GROUP, api.VERSION, namespace, api.PLURAL, "metered",
        {"status": {"progress": {"epoch": 1, "step": 40, "samplesPerSecond": 512.5, "stepSeconds": 0.125}}})
    job = {"namespace": namespace, "name": "metered"}
    wait_until(lambda: scoped.metric(P + "job_samples_per_second", **job) == 512.5, 10, "samples/s in the metrics")
    assert scoped.metric(P + "job_step_seconds", **job) == 0.125

    # A program failure, then an eviction: a gang restart each, counted by reason and kind.
    jobs.finish("metered-1", 137, "OOMKilled")
    jobs.wait_pods("metered", 3, attempt=1)
    jobs.wait_phase("metered", c.PHASE_RUNNING)
    jobs.evict("metered-2")
    jobs.wait_pods("metered", 3, attempt=2)
    jobs.wait_phase("metered", c.PHASE_RUNNING)
    assert delta(P + "gang_restarts_total", reason=c.REASON_RANK_FAILED, kind=c.KIND_PROGRAM) == 1
    assert delta(P + "gang_restarts_total", reason=c.REASON_RANK_EVICTED, kind=c.KIND_INFRASTRUCTURE) == 1
    assert delta(P + "pods_created_total") == 9  # 3 ranks x 3 attempts
    assert delta(P + "pods_deleted_total", forced="false") == 6  # each failed gang, whole
    assert delta(P + "time_to_running_seconds_count") == 1  # the first Running only

    jobs.delete("metered")
    wait_until(lambda: scoped.metric(P + "jobs", phase=c.PHASE_RUNNING) == 0, 20, "the job gone from the metrics")
    scrape = scoped.metrics()
    assert not [key for key in scrape if key[0].startswith(P + "job_") and ("name", "metered") in key[1]], scrape


@pytest.mark.parametrize("scoped", ["exact", "glob"], indirect=True)
def test_an_operator_watching_one_namespace_ignores_jobs_elsewhere(
        kube_api, namespace: str, scoped: OperatorProcess) -> None:
    core = Jobs(kube_api, namespace).core
    other = f"{namespace}-b"
    core.create_namespace({"metadata": {"name": other, "labels": {"ddp-operator-test": "true"}}})
    try:
        wait_until(lambda: core.list_namespaced_service_account(other).items, 30, f"default ServiceAccount in {other}")
        elsewhere, here = Jobs(kube_api, other), Jobs(kube_api, namespace)
        elsewhere.create("ignored", worldSize=2)
        here.create("served", worldSize=2)
        here.wait_phase("served", c.PHASE_RUNNING)
        # By now the operator has listed and watched its namespace; the other job is not its: it knows of one
        # job only, and never wrote of the other. (Its pods and status are not looked at: an operator of another
        # test session on a shared cluster, one that serves every namespace, may act on it.)
        assert scoped.metric(P + "jobs", phase=c.PHASE_RUNNING) == 1
        assert sum(v for (name, _), v in scoped.metrics().items() if name == P + "jobs") == 1
        assert other not in scoped.log_path.read_text()
    finally:
        core.delete_namespace(other, propagation_policy="Background")
