"""MultiKueue with two local control planes: a manager (tests/multikueue.py: no nodes, its own Kueue and
operator) and the session's cluster as the worker, with its Kueue and operator. A DDPJob submitted to the
manager with spec.managedBy kueue.x-k8s.io/multikueue runs on the worker, and its status comes back."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from ddp_contract import api
from ddp_operator import constants as c
from ddp_operator.kueue.rules import PREBUILT_WORKLOAD_KEY, QUEUE_LABEL
from kube import Cluster, Jobs, OperatorProcess, wait_until
from kueue import Queues
from multikueue import WORKER_SECRET, Manager

pytestmark = pytest.mark.cluster

ONE_CPU = {"requests": {"cpu": "1"}}


@pytest.fixture
def manager(cluster: Cluster, kueue: None, operator: OperatorProcess, namespace: str,
            tmp_path: Path) -> Iterator[client.ApiClient]:
    """The manager cluster's API, with the test's namespace; the worker is the session's cluster."""
    made = Manager(tmp_path, namespace)
    try:
        yield made.start(cluster.kubeconfig)
    finally:
        made.stop()
    assert "Traceback (most recent call last)" not in made.operator_log(), made.operator_log()[-5000:]


def workload_on(custom: client.CustomObjectsApi, namespace: str) -> dict[str, Any] | None:
    items = custom.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", namespace, "workloads")["items"]
    return items[0] if items else None


def finished(workload: dict[str, Any] | None) -> bool:
    return any(x["type"] == "Finished" and x["status"] == "True" for x in ((workload or {}).get("status") or {}).get(
        "conditions") or [])


def test_a_job_submitted_to_the_manager_runs_on_the_worker_and_ends_succeeded_on_the_manager(
        jobs: Jobs, queues: Queues, manager: client.ApiClient, namespace: str) -> None:
    queue = queues.create(cpu="2")  # the worker's
    at_manager = Queues(manager, namespace)
    at_manager.create(cpu="2", admission_checks=[at_manager.multikueue_check(WORKER_SECRET)])
    on_manager = Jobs(manager, namespace)
    try:
        on_manager.create("far", job_labels={QUEUE_LABEL: queue}, worldSize=2, resources=ONE_CPU,
                          managedBy=api.MANAGED_BY_MULTIKUEUE)
        pods = jobs.wait_pods("far", 2, timeout=60)  # the worker's copy, run by the worker's operator
        copy = jobs.get("far")
        assert copy is not None and "managedBy" not in copy["spec"]
        prebuilt = (copy["metadata"].get("annotations") or {}).get(PREBUILT_WORKLOAD_KEY) or \
            copy["metadata"]["labels"][PREBUILT_WORKLOAD_KEY]
        worker_workload = queues.custom.get_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", namespace,
                                                                     "workloads", prebuilt)
        assert [ref["uid"] for ref in worker_workload["metadata"]["ownerReferences"] if ref.get("controller")] == \
            [copy["metadata"]["uid"]], "the worker's operator adopts the Workload MultiKueue made, and makes none"
        assert len(queues.workloads()) == 1

        jobs.wait_phase("far", c.PHASE_RUNNING)
        status = on_manager.wait_phase("far", c.PHASE_RUNNING, timeout=60)  # MultiKueue's copy of the worker's
        assert status.get("readyRanks") == 2
        assert on_manager.pods("far") == [], "the manager makes no pod"

        for pod in pods:
            jobs.finish(pod.metadata.name, 0)
        status = on_manager.wait_phase("far", c.PHASE_SUCCEEDED, timeout=60)
        assert status["reason"] == c.REASON_SUCCEEDED
        wait_until(lambda: finished(workload_on(at_manager.custom, namespace)), 30, "the manager's Workload Finished")
        wait_until(lambda: jobs.get("far") is None, 60, "MultiKueue to delete the worker's copy")
    finally:
        at_manager.cleanup(on_manager)
