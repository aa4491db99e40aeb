"""A governed namespace refusing what a job needs, on a real API server with its own admission plugins
(Pod Security, ResourceQuota, LimitRange, a ValidatingAdmissionPolicy standing in for any webhook):
each refusal said on the job by rank group in the server's words, with its reason, an Event and the
`kubectl get` row; the refusals waiting cannot fix fail the job at once, a quota's waits; no pod of a
refused gang is left holding what the namespace has."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from ddp_operator import constants as c
from kube import Jobs, wait_until

ROOT_TEMPLATE = {"spec": {"securityContext": {"runAsUser": 0}}}


def said(jobs: Jobs, name: str, reason: str, timeout: float = 30) -> dict[str, Any]:
    """The job's status once its reason is `reason`, with the Warning Event that says so."""
    status = wait_until(lambda: (s := jobs.status(name)).get("reason") == reason and s, timeout, f"{name}: {reason}")
    wait_until(lambda: any(e.reason == reason and e.type == "Warning" for e in jobs.events(name)), 10, f"{reason} Event")
    return status  # type: ignore[return-value]


def row(kubectl, jobs: Jobs, name: str) -> list[str]:
    return kubectl("get", "ddpjobs", name, "-n", jobs.namespace, "--no-headers").stdout.split()


def no_pods(jobs: Jobs, name: str) -> bool:
    return jobs.pods(name, include_deleting=True) == []


def test_a_restricted_namespace_runs_a_plain_job_and_fails_one_asking_for_root_at_once(jobs: Jobs, kubectl) -> None:
    jobs.core.patch_namespace(jobs.namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})
    jobs.create("plain", worldSize=2)
    jobs.create("rooted", worldSize=2, template=ROOT_TEMPLATE)

    assert jobs.wait_phase("plain", c.PHASE_RUNNING)["ready"] == "2/2"  # secure by default: admitted as it is
    status = jobs.wait_phase("rooted", c.PHASE_FAILED)
    assert status["reason"] == c.REASON_POD_SECURITY
    assert status["message"].startswith('ranks 0-1 (PodSecurity): the API server refused the pod: violates PodSecurity '
                                        '"restricted:latest": '), status["message"]
    assert "runAsUser=0 (pod must not set runAsUser=0)" in status["message"]
    assert said(jobs, "rooted", c.REASON_POD_SECURITY)["phase"] == c.PHASE_FAILED
    assert row(kubectl, jobs, "rooted")[1:2] == ["Failed"] and c.REASON_POD_SECURITY in row(kubectl, jobs, "rooted")
    assert no_pods(jobs, "rooted")


def test_a_pod_quota_too_small_for_the_gang_creates_none_of_it_until_it_is_raised(jobs: Jobs, kubectl) -> None:
    jobs.quota("team", {"pods": "1"})
    jobs.create("three", worldSize=3)

    status = said(jobs, "three", c.REASON_QUOTA_EXCEEDED)
    assert status["phase"] == c.PHASE_PENDING and status["message"].startswith(
        "0/3 ranks ready, 0 pods exist; ranks 0-2 (QuotaExceeded): ResourceQuota team cannot hold the whole gang, so "
        "none of its pods is created: the gang's 3 pods need pods=3 with 0 used of 1"), status["message"]
    assert c.REASON_QUOTA_EXCEEDED in row(kubectl, jobs, "three") and no_pods(jobs, "three")

    jobs.core.patch_namespaced_resource_quota("team", jobs.namespace, {"spec": {"hard": {"pods": "3"}}})
    # Retried on a backoff that starts at 5 s: the next tries after the raise create the whole gang.
    assert jobs.wait_phase("three", c.PHASE_RUNNING, timeout=60)["ready"] == "3/3"


def test_one_gpu_left_for_two_one_gpu_ranks_holds_no_gpu_and_fails_at_the_startup_deadline(jobs: Jobs) -> None:
    jobs.quota("gpus", {"requests.nvidia.com/gpu": "1"})
    jobs.create("pair", worldSize=2, gpusPerRank=1, startupDeadlineSeconds=20)

    status = said(jobs, "pair", c.REASON_QUOTA_EXCEEDED)
    assert "requests.nvidia.com/gpu=2 with 0 used of 1" in status["message"] and no_pods(jobs, "pair")
    failed = jobs.wait_phase("pair", c.PHASE_FAILED, timeout=60)
    assert failed["reason"] == c.REASON_QUOTA_EXCEEDED and "still so after startupDeadlineSeconds=20" in failed["message"]
    assert no_pods(jobs, "pair")


@pytest.fixture
def cross_namespace_pod_quota(jobs: Jobs) -> Iterator[dict[str, Any]]:
    """A quota of one pod that counts only pods with cross-namespace affinity: the operator's check before
    creating leaves that scope to the API server, which then refuses part of the gang mid-creation."""
    jobs.quota("affine", {"pods": "1"}, scopeSelector={"matchExpressions": [
        {"scopeName": "CrossNamespacePodAffinity", "operator": "Exists"}]})
    term = {"labelSelector": {"matchLabels": {"nobody": "here"}}, "namespaceSelector": {},
            "topologyKey": "kubernetes.io/hostname"}
    yield {"spec": {"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "podAffinityTerm": term}]}}}}


def test_pods_created_before_a_quota_refused_the_rest_are_deleted(jobs: Jobs, cross_namespace_pod_quota) -> None:
    jobs.create("split", worldSize=3, template=cross_namespace_pod_quota)

    status = said(jobs, "split", c.REASON_QUOTA_EXCEEDED)
    assert "the API server refused the pod: exceeded quota: affine" in status["message"], status["message"]
    # The rank created before the refusal goes, so it stops holding the namespace's only pod.
    wait_until(lambda: no_pods(jobs, "split"), 30, "the partial gang deleted")
    assert jobs.status("split")["phase"] in (c.PHASE_PENDING, c.PHASE_STARTING)


def test_a_limit_range_that_refuses_the_ranks_fails_the_job_at_once(jobs: Jobs) -> None:
    jobs.core.create_namespaced_limit_range(jobs.namespace, {"metadata": {"name": "small"}, "spec": {"limits": [
        {"type": "Container", "max": {"memory": "1Gi"}}]}})
    jobs.create("big", worldSize=2, resources={"limits": {"memory": "2Gi"}})

    status = jobs.wait_phase("big", c.PHASE_FAILED)
    assert status["reason"] == c.REASON_LIMIT_RANGE and status["message"] == (
        "ranks 0-1 (LimitRange): the API server refused the pod: maximum memory usage per Container is 1Gi, but limit is 2Gi")
    assert said(jobs, "big", c.REASON_LIMIT_RANGE) and no_pods(jobs, "big")


@pytest.fixture
def no_gpus_here(jobs: Jobs) -> Iterator[str]:
    """A ValidatingAdmissionPolicy (standing in for any admission webhook) refusing GPU pods in the test's namespace."""
    admission = client.AdmissionregistrationV1Api(jobs.api)
    name = f"no-gpus-{jobs.namespace}"
    admission.create_validating_admission_policy({"metadata": {"name": name}, "spec": {
        "failurePolicy": "Fail",
        "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                                "resources": ["pods"]}]},
        "validations": [{"expression": "object.spec.containers.all(x, !has(x.resources.limits) || "
                                       "!('nvidia.com/gpu' in x.resources.limits))",
                         "message": "GPU pods are not allowed in this namespace"}]}})
    admission.create_validating_admission_policy_binding({"metadata": {"name": name}, "spec": {
        "policyName": name, "validationActions": ["Deny"],
        "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": jobs.namespace}}}}})
    try:
        yield name
    finally:
        admission.delete_validating_admission_policy_binding(name)
        admission.delete_validating_admission_policy(name)


def test_a_denying_admission_policy_fails_the_job_at_once_in_its_words(jobs: Jobs, no_gpus_here: str) -> None:
    # The policy is enforced once the API server has compiled it: a probe pod is refused first.
    probe = {"metadata": {"name": "probe"}, "spec": {"containers": [
        {"name": "x", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}

    def refused() -> bool:
        try:
            jobs.core.create_namespaced_pod(jobs.namespace, probe, dry_run="All")
        except client.ApiException as error:
            return error.status in (403, 422)
        return False

    wait_until(refused, 30, "the policy enforced")
    jobs.create("gpu", worldSize=2, gpusPerRank=1)
    status = jobs.wait_phase("gpu", c.PHASE_FAILED)
    assert status["reason"] == c.REASON_ADMISSION_DENIED
    assert status["message"] == (f"ranks 0-1 (AdmissionDenied): the API server refused the pod: ValidatingAdmissionPolicy "
                                 f"'{no_gpus_here}' with binding '{no_gpus_here}' denied request: GPU pods are not allowed "
                                 "in this namespace")
    assert said(jobs, "gpu", c.REASON_ADMISSION_DENIED) and no_pods(jobs, "gpu")


def test_a_service_quota_holds_every_rank_up_until_it_is_raised(jobs: Jobs) -> None:
    jobs.quota("no-services", {"services": "0"})
    jobs.create("svc", worldSize=2)

    status = said(jobs, "svc", c.REASON_QUOTA_EXCEEDED)
    assert "ranks 0-1 (QuotaExceeded): the API server refused the Service: exceeded quota: no-services" in status["message"]
    jobs.core.patch_namespaced_resource_quota("no-services", jobs.namespace, {"spec": {"hard": {"services": "1"}}})
    assert jobs.wait_phase("svc", c.PHASE_RUNNING, timeout=60)["ready"] == "2/2"
