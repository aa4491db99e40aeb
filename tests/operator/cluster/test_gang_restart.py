"""Gang restarts at scale: the new attempt's pods are created once and never deleted by the operator."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from kubernetes import client

from ddp_operator import constants as c
from ddp_operator.kubeapi import KubeApi, make_api_client
from fakenodes import on_fake_nodes
from kube import Cluster, Jobs, PodLives, wait_until

RANKS = 64
RESTARTS = 3


@pytest.fixture
def lives(jobs: Jobs) -> Iterator[PodLives]:
    with PodLives(jobs, "wide") as watch:
        yield watch


@pytest.mark.timeout(300)
def test_repeated_gang_restarts_of_64_ranks_create_each_pod_once(jobs: Jobs, lives: PodLives) -> None:
    jobs.create("wide", worldSize=RANKS, backoffLimit=RESTARTS + 1)
    jobs.wait_phase("wide", c.PHASE_RUNNING, timeout=60)
    for attempt in range(1, RESTARTS + 1):
        jobs.finish("wide-1", 137, "OOMKilled")  # as a kubelet reports an OOM kill
        jobs.wait_pods("wide", RANKS, attempt=attempt, timeout=60)

        def running_again(a: int = attempt) -> bool:
            status = jobs.status("wide")
            return status.get("phase") == c.PHASE_RUNNING and status.get("attempt") == a
        wait_until(running_again, 60, f"the gang Running again at attempt {attempt}")
        assert lives.deleted_of(attempt) == 0, f"attempt {attempt}: the operator deleted pods of the new gang"

    # An end the operator must act on, so any delete it still had queued has reached the API by then.
    for rank in range(RANKS):
        jobs.finish(f"wide-{rank}", 0)
    assert jobs.wait_phase("wide", c.PHASE_SUCCEEDED, timeout=60)["restarts"] == RESTARTS
    assert lives.deleted_of(RESTARTS) == 0
    assert lives.created() == {str(a): RANKS for a in range(RESTARTS + 1)}, "each rank once per attempt"


def test_a_late_delete_of_a_ranks_old_pod_spares_the_pod_that_took_its_name(cluster: Cluster, kube_api,
                                                                             namespace: str) -> None:
    """What the reconciler's deletes rely on: the uid it saw is a precondition of the call."""
    core = client.CoreV1Api(kube_api)
    pod = {"metadata": {"name": "rank-0"}, "spec": on_fake_nodes({"containers": [{"name": "trainer", "image": "trainer:test"}]})}
    old_uid = core.create_namespaced_pod(namespace, pod).metadata.uid
    core.delete_namespaced_pod("rank-0", namespace, grace_period_seconds=0)
    wait_until(lambda: not core.list_namespaced_pod(namespace).items, 30, "the old pod gone")
    new_uid = core.create_namespaced_pod(namespace, pod).metadata.uid

    async def late_delete() -> None:
        kube = KubeApi(make_api_client(cluster.kubeconfig))
        try:
            await kube.delete_pod(namespace, "rank-0", old_uid)  # answered 409, which is not an error here
        finally:
            kube.close()

    asyncio.run(late_delete())
    survivor = core.read_namespaced_pod("rank-0", namespace)
    assert survivor.metadata.uid == new_uid and survivor.metadata.deletion_timestamp is None
