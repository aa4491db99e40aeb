"""The chart's ValidatingAdmissionPolicy, on the test cluster's API server: a DDPJob, created or its spec
changed, is refused to whoever may not create pods in its namespace. Users are impersonated from the admin
kubeconfig (`kubectl --as`); their rights are Roles in the test's namespace, deleted with it."""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from ddp_contract import api
from fakenodes import on_fake_nodes
from helmchart import CHART, ON_FAKE_NODES, Helm, helm_for, installed, render, render_all
from kube import Cluster, Jobs, wait_until

POLICY, BINDING = "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"
CREATOR = "alice"  # may create and change DDPJobs, not pods
POD_CREATOR = "bob"  # may create DDPJobs and pods
RANK = "rank"  # a ServiceAccount that may only patch DDPJobs' status, as a rank's may its own job's
JOB_RULE = {"apiGroups": [api.GROUP], "resources": [api.PLURAL], "verbs": ["create", "get", "update", "patch"]}
POD_RULE = {"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}
STATUS_RULE = {"apiGroups": [api.GROUP], "resources": [f"{api.PLURAL}/status"], "verbs": ["get", "patch"]}
Kubectl = Callable[..., subprocess.CompletedProcess]


@pytest.fixture(scope="module")
def helm(cluster: Cluster) -> Helm:
    return helm_for(cluster)


def manifest(name: str) -> str:
    return json.dumps({"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name},
                       "spec": {"worldSize": 1, "image": "trainer:test", "command": ["python", "train.py"],
                                "gpusPerRank": 0, "template": {"spec": on_fake_nodes({})}}})


def refusal(user: str, namespace: str, doing: str) -> str:
    return (f"user {user} may not create pods in namespace {namespace}, and a DDPJob creates pods: "
            f"ask for pod create rights there ({doing} is not a way around RBAC)")


def grant(kube_api: client.ApiClient, namespace: str, name: str, rules: list[dict[str, Any]],
          subject: dict[str, str]) -> None:
    """A Role of `rules` bound to `subject` in the namespace."""
    rbac = client.RbacAuthorizationV1Api(kube_api)
    rbac.create_namespaced_role(namespace, {"metadata": {"name": name}, "rules": rules})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": name}, "subjects": [subject],
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}})


def user(name: str) -> dict[str, str]:
    return {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": name}


def grant_users(kube_api: client.ApiClient, namespace: str) -> None:
    """CREATOR, POD_CREATOR and the RANK ServiceAccount, with their rights in the namespace."""
    client.CoreV1Api(kube_api).create_namespaced_service_account(namespace, {"metadata": {"name": RANK}})
    grant(kube_api, namespace, CREATOR, [JOB_RULE], user(CREATOR))
    grant(kube_api, namespace, POD_CREATOR, [JOB_RULE, POD_RULE], user(POD_CREATOR))
    grant(kube_api, namespace, RANK, [STATUS_RULE], {"kind": "ServiceAccount", "name": RANK, "namespace": namespace})


@pytest.fixture
def as_user(kubectl: Kubectl) -> Callable[..., subprocess.CompletedProcess]:
    """as_user(user, namespace, *kubectl_args, input=None): kubectl impersonating the user."""
    def run(name: str, namespace: str, *args: str, input: str | None = None) -> subprocess.CompletedProcess:
        return kubectl("--as", name, "-n", namespace, *args, input=input, check=False)

    return run


def accepted(run: Callable[[], subprocess.CompletedProcess], release: str) -> subprocess.CompletedProcess:
    """run()'s result, waiting out a refusal by a policy of another release than `release`: on a cluster
    shared with other test sessions, their chart tests install releases that serve every namespace."""
    def outcome() -> subprocess.CompletedProcess | None:
        result = run()
        policy = re.search(r"ValidatingAdmissionPolicy '([^']+)'", result.stderr)
        return None if result.returncode and policy and release not in policy.group(1) else result

    return wait_until(outcome, 60, "another release's policy to go")  # type: ignore[return-value]


@pytest.fixture
def release(helm: Helm, kube_api: client.ApiClient, crd: None, namespace: str,
            as_user: Callable[..., subprocess.CompletedProcess], request: pytest.FixtureRequest) -> Iterator[str]:
    """A release serving the test's namespace (with the values of an indirect parameter), its users granted
    their rights there, and its policy enforced: the API server picks a new one up a moment after it is made."""
    grant_users(kube_api, namespace)
    name = f"ddp-{uuid.uuid4().hex[:6]}"
    values = [arg for setting in getattr(request, "param", ()) for arg in ("--set", setting)]
    helm("install", name, str(CHART), "-n", namespace, "--skip-crds", *ON_FAKE_NODES,
         "--set", f"watchNamespaces={{{namespace}}}", *values)
    try:
        policy = installed(helm, name, namespace).get(POLICY)
        if policy:
            probe = ("create", "--dry-run=server", "-f", "-")
            wait_until(lambda: f"'{policy['metadata']['name']}'" in
                       as_user(CREATOR, namespace, *probe, input=manifest("probe")).stderr, 30, "the policy to be enforced")
        yield name
    finally:
        helm("uninstall", name, "-n", namespace, "--wait", check=False)
    admission = client.AdmissionregistrationV1Api(kube_api)
    assert not [p for p in admission.list_validating_admission_policy().items if name in p.metadata.name]
    assert not [b for b in admission.list_validating_admission_policy_binding().items if name in b.metadata.name]


def test_creating_a_ddpjob_needs_pod_create_in_its_namespace(release: str, namespace: str, kube_api, as_user) -> None:
    refused = as_user(CREATOR, namespace, "create", "-f", "-", input=manifest("train"))
    assert refused.returncode != 0 and "(Forbidden)" in refused.stderr, refused.stderr
    assert refusal(CREATOR, namespace, "creating a DDPJob") in refused.stderr, refused.stderr
    assert Jobs(kube_api, namespace).get("train") is None

    created = as_user(POD_CREATOR, namespace, "create", "-f", "-", input=manifest("train"))
    assert created.returncode == 0, created.stderr


def test_changing_a_ddpjobs_spec_needs_pod_create_but_its_labels_and_status_do_not(
        release: str, namespace: str, kube_api, as_user) -> None:
    jobs = Jobs(kube_api, namespace)
    jobs.custom.create_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, json.loads(manifest("train")))

    spec_change = ("patch", api.KIND.lower(), "train", "--type=merge", "-p", json.dumps({"spec": {"image": "other:1"}}))
    refused = as_user(CREATOR, namespace, *spec_change)
    assert refused.returncode != 0 and refusal(CREATOR, namespace, "changing a DDPJob's spec") in refused.stderr, \
        refused.stderr
    assert (jobs.get("train") or {})["spec"]["image"] == "trainer:test"

    # What changes no pod is not checked: a label, and a rank's status patch through the status subresource.
    labelled = as_user(CREATOR, namespace, "label", api.KIND.lower(), "train", "team=a")
    assert labelled.returncode == 0, labelled.stderr
    progress = json.dumps({"status": {"progress": {"epoch": 1, "step": 10}}})
    rank = f"system:serviceaccount:{namespace}:{RANK}"
    status = as_user(rank, namespace, "patch", api.KIND.lower(), "train", "--subresource=status", "--type=merge",
                     "-p", progress)
    assert status.returncode == 0, status.stderr
    assert jobs.status("train")["progress"] == {"epoch": 1, "step": 10}

    changed = as_user(POD_CREATOR, namespace, *spec_change)
    assert changed.returncode == 0, changed.stderr
    assert (jobs.get("train") or {})["spec"]["image"] == "other:1"


def test_the_policy_holds_in_the_namespaces_the_release_serves_only(
        release: str, namespace: str, own_namespace: str, kube_api, as_user) -> None:
    grant_users(kube_api, own_namespace)
    elsewhere = accepted(lambda: as_user(CREATOR, own_namespace, "create", "-f", "-", input=manifest("train")), release)
    assert elsewhere.returncode == 0, elsewhere.stderr


@pytest.mark.parametrize("release", [["admissionPolicy.enabled=false"]], indirect=True, ids=["policy-off"])
def test_with_the_policy_off_a_user_who_may_not_create_pods_creates_a_ddpjob(
        helm: Helm, release: str, namespace: str, as_user) -> None:
    assert not {POLICY, BINDING} & set(installed(helm, release, namespace))
    created = accepted(lambda: as_user(CREATOR, namespace, "create", "-f", "-", input=manifest("train")), release)
    assert created.returncode == 0, created.stderr


def type_checked(admission: client.AdmissionregistrationV1Api, name: str) -> client.V1ValidatingAdmissionPolicy:
    """The policy once the API server has type-checked its current generation."""
    def checked() -> client.V1ValidatingAdmissionPolicy | None:
        policy = admission.read_validating_admission_policy(name)
        done = policy.status and policy.status.observed_generation == policy.metadata.generation
        return policy if done else None

    return wait_until(checked, 30, f"{name} to be type-checked")  # type: ignore[return-value]


def test_the_policys_expressions_type_check_against_the_ddpjob_schema(
        helm: Helm, release: str, namespace: str, kube_api) -> None:
    admission = client.AdmissionregistrationV1Api(kube_api)
    policy = installed(helm, release, namespace)[POLICY]
    checked = type_checked(admission, policy["metadata"]["name"])
    assert not checked.status.type_checking.expression_warnings

    # The check is real: the same policy with a field the DDPJob schema lacks is warned of (no binding, no effect).
    typo = {**policy, "metadata": {"name": f"{policy['metadata']['name']}-typo"}}
    typo["spec"] = {**policy["spec"], "validations": [{"expression": "object.spec.noSuchField == 1"}]}
    admission.create_validating_admission_policy(typo)
    try:
        warnings = type_checked(admission, typo["metadata"]["name"]).status.type_checking.expression_warnings
        assert [w.field_ref for w in warnings] == ["spec.validations[0].expression"]
        assert "undefined field 'noSuchField'" in warnings[0].warning
    finally:
        admission.delete_validating_admission_policy(typo["metadata"]["name"])


def test_the_policy_checks_ddpjob_creates_and_updates_never_status_and_fails_closed(helm: Helm) -> None:
    objects = render(helm)
    policy, binding = objects[POLICY], objects[BINDING]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"] == binding["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert "matchResources" not in binding["spec"]  # every namespace, as the operator serves every namespace
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    # A version named: with "*" the API server would not type-check the expressions.
    assert spec["matchConstraints"]["resourceRules"] == [{
        "apiGroups": [api.GROUP], "apiVersions": [api.VERSION], "resources": [api.PLURAL],
        "operations": ["CREATE", "UPDATE"]}]
    assert spec["matchConstraints"]["matchPolicy"] == "Equivalent"
    assert [v["expression"] for v in spec["validations"]] == [
        "authorizer.group('').resource('pods').namespace(request.namespace).check('create').allowed()"]


def test_with_watch_namespaces_the_binding_selects_those_namespaces(helm: Helm) -> None:
    binding = render(helm, "--set", "watchNamespaces={team-a,team-b}")[BINDING]
    assert binding["spec"]["matchResources"] == {"namespaceSelector": {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}]}}


def test_the_policy_is_not_installed_when_turned_off(helm: Helm) -> None:
    kinds = {doc["kind"] for doc in render_all(helm, "--set", "admissionPolicy.enabled=false")}
    assert kinds and not {POLICY, BINDING} & kinds
