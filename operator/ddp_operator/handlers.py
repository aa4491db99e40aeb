"""kopf registrations, kept thin: events feed the job store and the work queue, nothing more.

No daemons, timers or change handlers: those make kopf put finalizers on every DDPJob, and a
finalizer blocks deleting a job while the operator is down. Deadlines and TTLs are timed by
the work queue instead.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import kopf
from prometheus_client import REGISTRY

from ddp_contract import api
from ddp_contract.resource import job_key
from ddp_operator import metrics
from ddp_operator.config import OperatorConfig, exact, served
from ddp_operator.kubeapi import KubeApi, make_api_client
from ddp_operator.kueue.workloads import WorkloadCache
from ddp_operator.leader import LeaderElector
from ddp_operator.listwatch import watch_scopes
from ddp_operator.nodewatch import NodeCache
from ddp_operator.podwatch import PodCache
from ddp_operator.reconciler import JobStore, Reconciler

log = logging.getLogger(__name__)


class OperatorParts:
    """What the operator holds while it runs; one per process."""

    def __init__(self, namespaces: tuple[str, ...] = ()) -> None:
        """namespaces: the ones watched (empty: all); the nodes are watched cluster-wide either way."""
        self.namespaces = namespaces
        self.jobs = JobStore()
        scopes = len(watch_scopes(namespaces)[0])
        # Each scope's pod and Workload watches, and the nodes'.
        self.kube = KubeApi(make_api_client(os.environ.get("KUBECONFIG"), watches=2 * scopes + 1))
        self.loop = asyncio.get_running_loop()
        self.pods = PodCache(self.kube.api, self._job_changed, namespaces=namespaces)
        self.nodes = NodeCache(self.kube.api, self._nodes_changed)
        # Started by the first job that names a Kueue queue; the same namespaces as the pods.
        self.workloads = WorkloadCache(self.kube.api, self._job_changed, namespaces=namespaces)
        self.reconciler = Reconciler(self.kube, jobs=self.jobs, pods=self.pods, nodes=self.nodes.snapshot,
                                     workloads=self.workloads)
        self.collector = metrics.JobCollector(self.jobs.all)

    def _job_changed(self, key: tuple[str, str]) -> None:
        # Called on the pod-watch thread, which may outlive the loop by a moment at shutdown.
        if not self.loop.is_closed():
            self.reconciler.add_threadsafe(self.loop, key)

    def _nodes_changed(self, names: set[str]) -> None:
        """News of nodes concerns the jobs with pods on them (a node lost) and those with pods waiting
        for one (whether the gang fits at all)."""
        for key in self.pods.jobs_with(lambda pod: pod["spec"].get("nodeName") in names or not pod["spec"].get("nodeName")):
            self._job_changed(key)


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.watching.server_timeout = 270
    settings.watching.client_timeout = 300
    settings.posting.enabled = False  # our Events are posted by events.py, with our reasons
    settings.persistence.finalizer = f"{api.GROUP}/finalizer"  # never added: no change handlers
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)  # not a line per watch event
    config: OperatorConfig = memo.get("config") or OperatorConfig()
    if config.namespaces and exact(config.namespaces):
        settings.scanning.disabled = True  # exact names: kopf need not list the cluster's namespaces
    elector: LeaderElector | None = memo.get("elector")
    if elector is not None:
        await _until_leading(elector)
    metrics.LEADER.set(1)
    parts = memo.parts = OperatorParts(config.namespaces)
    parts.pods.start()
    parts.nodes.start()
    loop = asyncio.get_running_loop()
    # Until the nodes are listed nothing is judged by them (lost nodes, a gang's fit); pods come first.
    await asyncio.gather(loop.run_in_executor(None, parts.pods.wait_synced, 60),
                         loop.run_in_executor(None, parts.nodes.synced.wait, 10))
    parts.reconciler.start()
    REGISTRY.register(parts.collector)
    if "health" in memo:
        memo.health.add("event-loop", lambda: _loop_answers(loop))
    scope = ", ".join(config.namespaces) if config.namespaces else "every namespace"
    log.info("ddp-operator started (%s)", scope)


async def _until_leading(elector: LeaderElector) -> None:
    """The standby's wait: kopf watches nothing until the startup handlers are done."""
    log.info("ddp-operator standby: waiting for lease %s/%s", elector.lease.namespace, elector.lease.name)
    while not await asyncio.to_thread(elector.leading.wait, 1.0):  # not one long wait: SIGTERM cancels between
        pass


def _loop_answers(loop: asyncio.AbstractEventLoop, timeout: float = 5.0) -> bool:
    """Whether the event loop runs a callback within timeout seconds (called from the HTTP thread)."""
    return bool(asyncio.run_coroutine_threadsafe(asyncio.sleep(0, result=True), loop).result(timeout))


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    parts: OperatorParts | None = memo.get("parts")
    if parts is not None:
        parts.pods.stop()
        parts.nodes.stop()
        parts.workloads.stop()
        await parts.reconciler.stop()
        REGISTRY.unregister(parts.collector)
        parts.kube.close()
    elector: LeaderElector | None = memo.get("elector")
    if elector is not None:  # after the reconciler stopped: a standby taking over finds nothing in flight
        await asyncio.to_thread(elector.stop)


# async: kopf runs a plain function on a thread of its executor, and the work queue is not thread-safe.
@kopf.on.event(api.GROUP, api.VERSION, api.PLURAL)
async def job_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    parts: OperatorParts = memo.parts
    key = job_key(body)
    if not served(key[0], parts.namespaces):  # kopf watches the whole cluster for a glob
        return
    if event.get("type") == "DELETED":
        parts.jobs.remove(key)
        parts.reconciler.forget(key)
        return
    parts.jobs.put(dict(body))
    parts.reconciler.add(key)


@kopf.on.probe(id="jobs")
def jobs_known(memo: kopf.Memo, **_: Any) -> int:
    parts: OperatorParts | None = memo.get("parts")
    return len(parts.jobs) if parts else 0
