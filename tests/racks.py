"""kwok's four fake nodes labelled into two racks of two by a label of the test's own (`racks`, the
`rack` fixture), for the tests of spec.topology, with and without Kueue."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

from kubernetes import client

from ddp_contract import api
from kube import Jobs, wait_until

# One 40-cpu pod fits on a 64-cpu fake node: a rack of two nodes holds two pods.
BIG_POD = {"requests": {"cpu": "40"}}
RACKS = {"gpu-node-0": "r1", "gpu-node-1": "r1", "gpu-node-2": "r2", "gpu-node-3": "r2"}


@contextlib.contextmanager
def racks(jobs: Jobs) -> Iterator[str]:
    """The fake nodes labelled into racks by a label of the test's own (removed after, once the test's jobs
    and their pods are gone): its key."""
    key = f"ddp-test.io/rack-{uuid.uuid4().hex[:6]}"
    for node, value in RACKS.items():
        jobs.core.patch_node(node, {"metadata": {"labels": {key: value}}})
    try:
        yield key
    finally:
        # The next test counts the racks' room afresh: this one's pods are gone first.
        names = [job["metadata"]["name"] for job in jobs.custom.list_namespaced_custom_object(
            api.GROUP, api.VERSION, jobs.namespace, api.PLURAL)["items"]]
        for name in names:
            jobs.delete(name)
        wait_until(lambda: not any(jobs.pods(n, include_deleting=True) for n in names), 60, "the test's pods to go")
        for node in RACKS:
            jobs.core.patch_node(node, {"metadata": {"labels": {key: None}}})


def bound_racks(jobs: Jobs, name: str, count: int) -> list[str]:
    """The rack of each of the job's pods, in pod order, once all `count` are bound."""
    def bound() -> list[client.V1Pod] | None:
        pods = jobs.pods(name)
        return pods if len(pods) == count and all(p.spec.node_name for p in pods) else None

    pods = wait_until(bound, 30, f"{name}'s {count} pods to be bound")
    by_index = sorted(pods, key=lambda p: int(p.metadata.name.rsplit("-", 1)[1]))  # type: ignore[union-attr]
    return [RACKS[p.spec.node_name] for p in by_index]
