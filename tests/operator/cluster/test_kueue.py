"""DDPJobs in Kueue queues, with Kueue (built from its Go module) running on the local control plane.

Each job asks for 1 cpu per pod; each test's ClusterQueue covers cpu for its namespace alone.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from ddp_contract import envnames
from ddp_operator import constants as c
from ddp_operator.kueue.flavors import REQUIRED_TOPOLOGY_ANNOTATION
from ddp_operator.kueue.rules import PRIORITY_CLASS_LABEL, QUEUE_LABEL
from ddp_operator.manifests import progress_service_account
from ddp_trainer.jobstatus import JobStatusSink, last_checkpoint
from fakenodes import on_fake_nodes
from helmchart import CHART, ON_FAKE_NODES, helm_for, installed, operator_settings
from kube import Cluster, Jobs, OperatorProcess, PodLives, client_as, env_of, kubeconfig_of, wait_until
from kueue import Queues
from racks import BIG_POD, bound_racks

pytestmark = pytest.mark.alone("installs the chart for every namespace and restarts the session's operator to serve them all")

ONE_CPU = {"requests": {"cpu": "1"}}


def queued(jobs: Jobs, name: str, queue: str, priority: str | None = None, **spec: Any) -> None:
    job_labels = {QUEUE_LABEL: queue, **({PRIORITY_CLASS_LABEL: priority} if priority else {})}
    jobs.create(name, job_labels=job_labels, **{"worldSize": 2, "resources": ONE_CPU, **spec})


def waiting(jobs: Jobs, name: str, words: str) -> dict[str, Any]:
    """Waits until the job is Pending in its queue with `words` (Kueue's) in its message."""
    def queued_so() -> dict[str, Any] | None:
        status = jobs.status(name)
        ok = status.get("phase") == c.PHASE_PENDING and status.get("reason") == c.REASON_QUEUED
        return status if ok and words in status.get("message", "") else None

    try:
        return wait_until(queued_so, 30, f"{name} queued saying {words!r}")  # type: ignore[return-value]
    except AssertionError as error:
        raise AssertionError(f"{error}; status is {jobs.status(name)}") from None


def evicted(jobs: Jobs, name: str, words: str) -> None:
    """Waits for the job's Evicted Event (Kueue's reason in its message): the Suspended phase it
    brings lasts only until the pods are gone, which may be too short to catch by polling."""
    def said() -> bool:
        return any(e.reason == c.REASON_EVICTED and words in e.message for e in jobs.events(name))

    wait_until(said, 30, f"{name} evicted ({words})")
    conditions = {cond["type"]: cond for cond in jobs.status(name).get("conditions", [])}
    assert c.COND_SUSPENDED in conditions, "an evicted job passes through the Suspended phase"


def finish_all(jobs: Jobs, name: str) -> None:
    for pod in jobs.pods(name):
        jobs.finish(pod.metadata.name, 0)


def test_a_queued_job_has_no_pods_until_kueue_admits_the_whole_gang(jobs, queues: Queues) -> None:
    queue = queues.create(cpu="1")  # one pod's worth: the gang of two does not fit
    with PodLives(jobs, "gated") as lives:
        queued(jobs, "gated", queue)
        status = waiting(jobs, "gated", "insufficient")
        assert f"LocalQueue {queue}" in status["message"] and "startTime" not in status
        workload = wait_until(lambda: queues.workload_of("gated"), 10, "the job's Workload")
        assert workload["spec"]["podSets"][0]["count"] == 2  # type: ignore[index]
        jobs.observed("gated")  # a later pass, still not admitted
        assert lives.created() == {}, "a job waiting for Kueue must create no pod, not even briefly"

        queues.set_quota("2")
        jobs.wait_phase("gated", c.PHASE_RUNNING)
        assert lives.created() == {"0": 2}
    admitted = queues.workload_of("gated")
    assert any(x["type"] == "Admitted" and x["status"] == "True" for x in admitted["status"]["conditions"])  # type: ignore[index]


def test_a_second_job_waits_for_the_quota_the_first_holds_and_starts_when_it_finishes(jobs, queues: Queues) -> None:
    queue = queues.create(cpu="2")
    queued(jobs, "first", queue)
    jobs.wait_phase("first", c.PHASE_RUNNING)
    queued(jobs, "second", queue)
    waiting(jobs, "second", "insufficient unused quota for cpu")
    assert jobs.pods("second") == []

    finish_all(jobs, "first")
    jobs.wait_phase("first", c.PHASE_SUCCEEDED)
    finished = wait_until(lambda: queues.workload_of("first"), 5, "first's Workload")
    wait_until(lambda: any(x["type"] == "Finished" and x["status"] == "True"
                           for x in (queues.workload_of("first") or finished)["status"]["conditions"]),
               30, "first's Workload to be Finished")
    jobs.wait_phase("second", c.PHASE_RUNNING)
    # The event is written after the status that says Running: wait for it rather than read it at once.
    wait_until(lambda: {e.reason for e in jobs.events("second")} >= {c.REASON_QUEUED, c.REASON_ALL_READY}, 30,
               "second's Queued and AllRanksReady events")


def test_each_job_runs_on_the_nodes_of_the_flavor_kueue_admitted_it_to(jobs, queues: Queues) -> None:
    """Two flavors of one queue, pinned to two fake nodes: the first job fills the first flavor, the
    second is admitted to the second, and its ranks' and data workers' pods carry that flavor's node
    labels and tolerations and run on its node."""
    reserved = {"key": "ddp-test/reserved", "operator": "Exists", "effect": "NoSchedule"}
    queue = queues.create(cpu="3", flavors=[{"nodeLabels": {"kubernetes.io/hostname": "gpu-node-0"}},
                                            {"nodeLabels": {"kubernetes.io/hostname": "gpu-node-1"},
                                             "tolerations": [reserved]}])
    workers = {"replicas": 1, "resources": ONE_CPU, "template": {"spec": on_fake_nodes({})}}
    queued(jobs, "first", queue, dataWorkers=workers)
    jobs.wait_phase("first", c.PHASE_RUNNING)
    queued(jobs, "second", queue, dataWorkers=workers)
    jobs.wait_phase("second", c.PHASE_RUNNING)
    for name, i in (("first", 0), ("second", 1)):
        admission = queues.workload_of(name)["status"]["admission"]  # type: ignore[index]
        assert {a["name"]: a["flavors"]["cpu"] for a in admission["podSetAssignments"]} == {
            "ranks": queues.flavor_name(i), "data-workers": queues.flavor_name(i)}
        def bound(job: str = name) -> list[client.V1Pod] | None:
            pods = jobs.pods(job)
            return pods if len(pods) == 3 and all(p.spec.node_name for p in pods) else None

        pods = wait_until(bound, 30, f"{name}'s two ranks and data worker to be bound")
        for pod in pods:
            assert pod.spec.node_selector["kubernetes.io/hostname"] == f"gpu-node-{i}", pod.metadata.name
            assert pod.spec.node_name == f"gpu-node-{i}", pod.metadata.name
            tolerations = {t.key for t in pod.spec.tolerations or []}
            assert ("ddp-test/reserved" in tolerations) == (i == 1), pod.metadata.name


def test_kueues_topology_assignment_puts_a_gang_in_one_rack_with_its_ranks_in_order(jobs, queues: Queues,
                                                                                     rack: str) -> None:
    """Kueue's topology-aware scheduling over two racks of two fake nodes: a gang of two 40-cpu pods is
    admitted into one rack and its pods pinned there; a gang of three fits in no rack and waits in its
    queue, saying so in Kueue's words."""
    topology = queues.topology(rack, "kubernetes.io/hostname")
    queue = queues.create(cpu="400", flavors=[{"nodeLabels": {"type": "kwok"}, "topologyName": topology}])
    queued(jobs, "near", queue, gpusPerRank=0, resources=BIG_POD, topology={"required": rack})
    jobs.wait_phase("near", c.PHASE_RUNNING)
    # Kueue names the lowest level only (a node's name says its rack): each pod is pinned to its node.
    assignment = queues.workload_of("near")["status"]["admission"]["podSetAssignments"][0]  # type: ignore[index]
    assert assignment["topologyAssignment"]["levels"] == ["kubernetes.io/hostname"]
    assert len(set(bound_racks(jobs, "near", 2))) == 1
    for pod in jobs.pods("near"):
        assert pod.spec.node_selector["kubernetes.io/hostname"] == pod.spec.node_name
        assert pod.metadata.annotations[REQUIRED_TOPOLOGY_ANNOTATION] == rack

    queued(jobs, "wide", queue, worldSize=3, gpusPerRank=0, resources=BIG_POD, topology={"required": rack})
    waiting(jobs, "wide", "topology")
    assert jobs.pods("wide") == []


def test_a_preempted_job_comes_back_and_resumes_from_its_checkpoint(jobs, queues: Queues, kube_api) -> None:
    queue = queues.create(cpu="2", preemption="LowerPriority")
    low, high = queues.priority_class("low", 100), queues.priority_class("high", 1000)
    queued(jobs, "patient", queue, priority=low)
    jobs.wait_phase("patient", c.PHASE_RUNNING)
    first = {p.metadata.uid for p in jobs.pods("patient")}
    sink = JobStatusSink(jobs.namespace, "patient",
                         api_client=client_as(kube_api, jobs.namespace, progress_service_account("patient")))
    uri = "s3://bucket/runs/patient/checkpoints/step-000000000500"
    assert sink.patch({"lastCheckpoint": last_checkpoint(500, uri)})

    queued(jobs, "urgent", queue, priority=high)
    evicted(jobs, "patient", "Preempted")
    jobs.wait_phase("urgent", c.PHASE_RUNNING)
    assert not first & {p.metadata.uid for p in jobs.pods("patient", include_deleting=True)}
    waiting(jobs, "patient", "insufficient unused quota for cpu")

    finish_all(jobs, "urgent")
    jobs.wait_phase("urgent", c.PHASE_SUCCEEDED)
    status = jobs.wait_phase("patient", c.PHASE_RUNNING)
    assert status["restarts"] == 0 and status["infrastructureRestarts"] == 0  # an eviction is no failure
    pods = jobs.pods("patient")
    assert len(pods) == 2 and not first & {p.metadata.uid for p in pods}
    assert all(env_of(p)[envnames.RESUME_FROM] == uri for p in pods)
    ready = sum(e.count or 1 for e in jobs.events("patient") if e.reason == c.REASON_ALL_READY)
    assert c.REASON_QUEUED in {e.reason for e in jobs.events("patient")} and ready >= 2


@pytest.mark.parametrize("scope", ["cluster", "namespace"])
def test_queued_jobs_run_under_the_charts_rbac(jobs, queues: Queues, operator: OperatorProcess, cluster: Cluster,
                                               kube_api, tmp_path: Path, scope: str) -> None:
    """Every Kueue call the operator makes (create and watch Workloads, read a priority class,
    deactivate a suspended job's Workload, hand an evicted one's quota back) under the chart's RBAC:
    its ClusterRole when it serves every namespace, a Role in each with watchNamespaces (the Workloads
    then watched in that namespace alone)."""
    helm, release, namespace = helm_for(cluster), f"ddp-{uuid.uuid4().hex[:6]}", jobs.namespace
    narrowed = ("--set", f"watchNamespaces={{{namespace}}}") if scope == "namespace" else ()
    helm("install", release, str(CHART), "-n", namespace, "--skip-crds", *ON_FAKE_NODES, *narrowed)
    try:
        objects = installed(helm, release, namespace)
        account = objects["ServiceAccount"]["metadata"]["name"]
        # cluster: as the chart installs it (every namespace, no lease needed here); namespace: its settings.
        env = {} if scope == "cluster" else operator_settings(objects)
        admin, session = operator.kubeconfig, operator.env
        operator.restart(kubeconfig=str(kubeconfig_of(kube_api, account, namespace, admin, tmp_path)), env=env)
        try:
            queue = queues.create(cpu="2", preemption="LowerPriority")
            low, high = queues.priority_class("low", 100), queues.priority_class("high", 1000)
            queued(jobs, "modest", queue, priority=low)
            jobs.wait_phase("modest", c.PHASE_RUNNING)
            queued(jobs, "pressing", queue, priority=high)
            evicted(jobs, "modest", "Preempted")
            jobs.wait_phase("pressing", c.PHASE_RUNNING)
            jobs.patch_spec("pressing", suspend=True)  # its Workload deactivated: the quota goes back to modest
            jobs.wait_phase("modest", c.PHASE_RUNNING)
            log = operator.log_path.read_text().split("--- restart ---")[-1]
            assert "Forbidden" not in log and "refused" not in log and "Not enough permissions" not in log, log[-3000:]
        finally:
            operator.restart(kubeconfig=admin, env=session)
    finally:
        helm("uninstall", release, "-n", namespace, check=False)


def test_a_queued_job_says_why_when_the_operator_may_not_see_workloads(
        jobs, queues: Queues, operator: OperatorProcess, cluster: Cluster, kube_api, tmp_path: Path) -> None:
    """The chart's Role for the namespace without its Kueue rules (as an older chart installed it): the
    queued job creates no pod and says what the operator lacks."""
    helm, release, namespace = helm_for(cluster), f"ddp-{uuid.uuid4().hex[:6]}", jobs.namespace
    helm("install", release, str(CHART), "-n", namespace, "--skip-crds", *ON_FAKE_NODES,
         "--set", f"watchNamespaces={{{namespace}}}")
    try:
        objects = installed(helm, release, namespace)
        rbac = client.RbacAuthorizationV1Api(jobs.core.api_client)
        role = next(r for r in rbac.list_namespaced_role(namespace).items
                    if any("kueue.x-k8s.io" in (rule.api_groups or []) for rule in r.rules))
        kept = [rule for rule in rbac.api_client.sanitize_for_serialization(role.rules)
                if "kueue.x-k8s.io" not in rule.get("apiGroups", [])]
        rbac.patch_namespaced_role(role.metadata.name, namespace, [{"op": "replace", "path": "/rules", "value": kept}])
        admin, session = operator.kubeconfig, operator.env
        account = objects["ServiceAccount"]["metadata"]["name"]
        operator.restart(kubeconfig=str(kubeconfig_of(kube_api, account, namespace, admin, tmp_path)),
                         env=operator_settings(objects))
        try:
            queue = queues.create(cpu="2")
            with PodLives(jobs, "blind") as lives:
                queued(jobs, "blind", queue)
                status = waiting(jobs, "blind", "403 Forbidden")
                assert "needs get, list, watch, create and patch on workloads.kueue.x-k8s.io" in status["message"]
                jobs.observed("blind")
                assert lives.created() == {}, "a job the operator cannot see admitted creates no pod"
        finally:
            operator.restart(kubeconfig=admin, env=session)
    finally:
        helm("uninstall", release, "-n", namespace, check=False)
