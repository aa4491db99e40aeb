"""Gang restarts at scale: the new attempt's pods are created once and never deleted by the operator."""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from typing import Iterator

import pytest
from kubernetes import client
from kubernetes.watch.watch import iter_resp_lines

from ddp_operator import constants as c
from ddp_operator.kubeapi import KubeApi, make_api_client
from kube import Cluster, Jobs, wait_until

RANKS = 64
RESTARTS = 3


class PodLives:
    """Every pod object of one job (by uid: restarts reuse the names) and whether it was deleted."""

    def __init__(self, jobs: Jobs, name: str) -> None:
        self.attempt_of: dict[str, str] = {}
        self.deleted: set[str] = set()
        self.lock = threading.Lock()
        self._jobs, self._name = jobs, name
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> PodLives:
        self._thread.start()
        assert self._ready.wait(10), "the pod watch did not start"
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(15)

    def _watch(self) -> None:
        response = self._jobs.core.list_namespaced_pod(
            self._jobs.namespace, label_selector=f"{c.LABEL_JOB_NAME}={self._name}", watch=True,
            timeout_seconds=300, _preload_content=False)
        self._ready.set()
        try:
            for line in iter_resp_lines(response):
                event = json.loads(line)
                meta = event["object"]["metadata"]
                with self.lock:
                    self.attempt_of[meta["uid"]] = meta["labels"][c.LABEL_ATTEMPT]
                    if event["type"] == "DELETED" or meta.get("deletionTimestamp"):
                        self.deleted.add(meta["uid"])
                if self._stop.is_set():
                    return
        finally:
            response.release_conn()

    def created(self) -> Counter[str]:
        """Pods created per attempt."""
        with self.lock:
            return Counter(self.attempt_of.values())

    def deleted_of(self, attempt: int) -> int:
        with self.lock:
            return sum(1 for uid in self.deleted if self.attempt_of[uid] == str(attempt))


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
    pod = {"metadata": {"name": "rank-0"}, "spec": {"containers": [{"name": "trainer", "image": "trainer:test"}]}}
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
