"""The Helm chart: the CRD copy, lint and values schema, the install, and the operator running under its RBAC."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from ddp_contract import api
from ddp_operator import constants as c
from ddp_operator.config import (
    ENV_IDENTITY,
    ENV_LEASE_DURATION,
    ENV_LEASE_NAME,
    ENV_LEASE_NAMESPACE,
    ENV_LEASE_RENEW_DEADLINE,
    ENV_LEASE_RETRY_PERIOD,
    ENV_LIVENESS,
    ENV_METRICS_ADDRESS,
    ENV_METRICS_PORT,
    ENV_NAMESPACES,
)
from ddp_operator.kueue.rules import KUEUE_GROUP
from helmchart import CHART, ON_FAKE_NODES, helm_for, installed, operator_settings, render, render_all
from kube import REPO, Cluster, env_of, glob_for, kubeconfig_of, wait_until

pytestmark = pytest.mark.alone("installs the chart for every namespace (a cluster-wide admission policy) and makes "
                               "the session's operator serve every namespace")

WORKLOADS = f"workloads.{KUEUE_GROUP}"
SYNC = Path("scripts") / "sync-crds.sh"
CHART_CRD = Path("charts") / "crds" / "ddpjob.yaml"
KINDS = ["ClusterRole", "ClusterRoleBinding", "Deployment", "Role", "RoleBinding", "ServiceAccount",
         "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]


@pytest.fixture(scope="module")
def helm(cluster: Cluster):
    return helm_for(cluster)


def sync(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(root / SYNC), *args], capture_output=True, text=True)


@pytest.fixture
def repo_copy(tmp_path: Path) -> Path:
    """The parts of the repository sync-crds.sh works on, so a test may break them."""
    for part in ("crds", "charts/crds", "scripts"):
        shutil.copytree(REPO / part, tmp_path / part)
    return tmp_path


def test_the_charts_crd_is_the_one_in_crds() -> None:
    result = sync(REPO, "--check")
    assert result.returncode == 0, result.stderr


def test_sync_check_names_a_copy_that_drifted_and_sync_repairs_it(repo_copy: Path) -> None:
    drifted = repo_copy / CHART_CRD
    source = drifted.read_text()
    drifted.write_text(source.replace("maximum: 65536", "maximum: 8192", 1))
    assert drifted.read_text() != source, "the copy must differ for the check to find it"
    result = sync(repo_copy, "--check")
    assert result.returncode == 1 and f"{CHART_CRD} differs" in result.stderr

    assert sync(repo_copy).returncode == 0
    assert sync(repo_copy, "--check").returncode == 0
    assert drifted.read_bytes() == (REPO / "crds" / "ddpjob.yaml").read_bytes()


def test_sync_check_names_a_missing_copy_and_a_stray_one(repo_copy: Path) -> None:
    (repo_copy / CHART_CRD).rename(repo_copy / CHART_CRD.with_name("old.yaml"))
    result = sync(repo_copy, "--check")
    assert result.returncode == 1
    assert f"{CHART_CRD} is missing" in result.stderr
    assert "charts/crds/old.yaml has no source" in result.stderr


def test_chart_lints_and_renders_the_operator_deployment(helm) -> None:
    assert helm("lint", "--strict", str(CHART)).returncode == 0
    objects = render(helm)
    assert sorted(objects) == KINDS

    deployment = objects["Deployment"]
    # The Lease keeps a new pod a standby until the old one lets go, so updates may roll.
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == "ddp-operator/operator:0.1.0"  # the tag defaults to appVersion
    assert container["command"] == ["python", "-m", "ddp_operator"]
    # The probe asks the operator's own endpoint (a standby's too), on the port the operator is told to serve.
    env = env_of(container)
    probe = container["livenessProbe"]["httpGet"]
    port = next(p["containerPort"] for p in container["ports"] if p["name"] == probe["port"])
    assert probe["path"] == "/healthz" and probe["port"] == "metrics"
    assert (env[ENV_METRICS_ADDRESS], env[ENV_METRICS_PORT]) == ("0.0.0.0", str(port))
    assert ENV_NAMESPACES not in env and ENV_LIVENESS not in env
    # Leader election on by default: the Lease is named after the release, each pod holds it by its name.
    assert env[ENV_LEASE_NAME] == objects["Deployment"]["metadata"]["name"] and env[ENV_LEASE_NAMESPACE] == "ops"
    assert env[ENV_IDENTITY] == "metadata.name"
    assert (env[ENV_LEASE_DURATION], env[ENV_LEASE_RENEW_DEADLINE], env[ENV_LEASE_RETRY_PERIOD]) == ("15", "10", "2")
    assert objects["Role"]["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["serviceAccountName"] == objects["ServiceAccount"]["metadata"]["name"]
    assert objects["ClusterRoleBinding"]["subjects"] == [
        {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": "ops"}]

    for obj in objects.values():
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "ddp-operator"
        assert labels["app.kubernetes.io/instance"] == "rel"
        assert labels["app.kubernetes.io/version"] == "0.1.0"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"


def test_values_reach_the_pod(helm) -> None:
    toleration = {"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}
    values = {
        "image": {"repository": "registry.example.com/ddp", "tag": "1.2.3", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "regcred"}],
        "verbose": True,
        "nodeSelector": {"pool": "system"},
        "tolerations": [toleration],
        "affinity": {"nodeAffinity": {}},
        "podAnnotations": {"example.com/scrape": "false"},
        "resources": {"limits": {"memory": "1Gi"}},
        "priorityClassName": "system-cluster-critical",
    }
    objects = render(helm, *(arg for key, value in values.items()
                             for arg in ("--set-json", f"{key}={json.dumps(value)}")))
    template = objects["Deployment"]["spec"]["template"]
    pod, container = template["spec"], template["spec"]["containers"][0]
    assert (container["image"], container["imagePullPolicy"]) == ("registry.example.com/ddp:1.2.3", "Always")
    assert {"name": "DDP_OPERATOR_VERBOSE", "value": "1"} in container["env"]
    # Helm merges maps: the default requests stay.
    assert container["resources"] == {"limits": {"memory": "1Gi"}, "requests": {"cpu": "100m", "memory": "128Mi"}}
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["nodeSelector"] == {"pool": "system"} and pod["tolerations"] == [toleration]
    assert pod["affinity"] == {"nodeAffinity": {}} and pod["priorityClassName"] == "system-cluster-critical"
    assert template["metadata"]["annotations"] == {"example.com/scrape": "false"}


@pytest.mark.parametrize("setting, named", [
    ("bogus=1", "'bogus' not allowed"),
    ("image.bogus=1", "'bogus' not allowed"),
    ("resources.request.cpu=1", "'request' not allowed"),
    ("image.pullPolicy=Sometimes", "pullPolicy"),
    ("watchNamespaces={Bad_Name}", "watchNamespaces"),
    ("metrics.port=70000", "port"),
    ("metrics.service.type=Headless", "type"),
    ("leaderElection.leaseDuration=fifteen", "leaseDuration"),
    ("admissionPolicy.enabled=maybe", "enabled"),
    ("admissionPolicy.bogus=1", "'bogus' not allowed"),
])
def test_schema_refuses_unknown_and_bad_values(helm, setting: str, named: str) -> None:
    refused = helm("template", "rel", str(CHART), "--set", setting, check=False)
    assert refused.returncode != 0 and named in refused.stderr, refused.stderr


def test_the_chart_refuses_a_kubernetes_older_than_the_oldest_it_is_tested_on(helm) -> None:
    refused = helm("template", "rel", str(CHART), "--kube-version", "1.29.15", check=False)
    assert refused.returncode != 0, refused.stdout[:200]
    assert "requires kubeVersion: >=1.30.0-0" in refused.stderr and "v1.29.15" in refused.stderr, refused.stderr
    for release in ("1.30.0", "1.37.2"):
        assert render(helm, "--kube-version", release)["Deployment"]


def test_cluster_scoped_names_differ_between_namespaces(helm) -> None:
    for kind in ("ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
        names = {render(helm, namespace=ns)[kind]["metadata"]["name"] for ns in ("team-a", "team-b")}
        assert len(names) == 2 and all("team-" in name for name in names), names


RBAC_RESOURCES = {"roles", "rolebindings", "clusterroles", "clusterrolebindings"}


def can_i(kube_api, account: str, verb: str, resource: str, *flags: str) -> bool:
    """`kubectl auth can-i VERB RESOURCE[.GROUP] [--subresource=S] [-n NS | -A] --as ACCOUNT`, asked of
    the API server's authorizer directly (a SubjectAccessReview): kubectl resolves the resource through
    discovery first, and says no for one whose CRD is not installed (Kueue's, before Kueue runs).
    Without -n the question is cluster-wide."""
    plural, _, group = resource.partition(".")
    if not group and plural in RBAC_RESOURCES:
        group = "rbac.authorization.k8s.io"
    attributes = {"verb": verb, "resource": plural, "group": group, "namespace": ""}
    rest = list(flags)
    while rest:
        flag = rest.pop(0)
        if flag.startswith("--subresource="):
            attributes["subresource"] = flag.split("=", 1)[1]
        elif flag == "-n":
            attributes["namespace"] = rest.pop(0)
        elif flag != "-A":
            raise ValueError(f"can_i: unknown flag {flag}")
    review = client.AuthorizationV1Api(kube_api).create_subject_access_review(
        {"spec": {"user": account, "groups": ["system:serviceaccounts", "system:authenticated"],
                  "resourceAttributes": attributes}})
    return bool(review.status.allowed)


def live(kube_api, kind: str, name: str, namespace: str) -> Any:
    """The object as the API server has it, or None."""
    rbac, core, apps = client.RbacAuthorizationV1Api(kube_api), client.CoreV1Api(kube_api), client.AppsV1Api(kube_api)
    admission = client.AdmissionregistrationV1Api(kube_api)
    read = {
        "ClusterRole": lambda: rbac.read_cluster_role(name),
        "ClusterRoleBinding": lambda: rbac.read_cluster_role_binding(name),
        "Role": lambda: rbac.read_namespaced_role(name, namespace),
        "RoleBinding": lambda: rbac.read_namespaced_role_binding(name, namespace),
        "Deployment": lambda: apps.read_namespaced_deployment(name, namespace),
        "ServiceAccount": lambda: core.read_namespaced_service_account(name, namespace),
        "ValidatingAdmissionPolicy": lambda: admission.read_validating_admission_policy(name),
        "ValidatingAdmissionPolicyBinding": lambda: admission.read_validating_admission_policy_binding(name),
    }[kind]
    try:
        return read()
    except client.ApiException as error:
        if error.status == 404:
            return None
        raise


def test_install_grants_the_operator_what_it_needs_and_uninstall_removes_it(
        helm, kube_api, crd, namespace) -> None:
    # crd: the CRD is installed cluster-wide (tests share it), hence --skip-crds.
    release = f"ddp-{uuid.uuid4().hex[:6]}"
    result = helm("install", release, str(CHART), "-n", namespace, "--skip-crds", *ON_FAKE_NODES)
    try:
        assert "kubectl get ddpjobs" in result.stdout  # NOTES.txt
        objects = installed(helm, release, namespace)
        assert sorted(objects) == KINDS
        for kind, obj in objects.items():
            found = live(kube_api, kind, obj["metadata"]["name"], namespace)
            assert found is not None, f"{kind} {obj['metadata']['name']}"
            assert found.metadata.labels["app.kubernetes.io/instance"] == release
            assert found.metadata.labels["app.kubernetes.io/managed-by"] == "Helm"
            assert found.metadata.labels["app.kubernetes.io/name"] == "ddp-operator"
        assert namespace in objects["ClusterRole"]["metadata"]["name"]

        account = f"system:serviceaccount:{namespace}:{objects['ServiceAccount']['metadata']['name']}"
        job, status, elsewhere = f"{api.PLURAL}.{api.GROUP}", "--subresource=status", ["-n", "any-namespace"]
        allowed = [["create", "pods"], ["delete", "pods"], ["watch", "pods"], ["list", job], ["delete", job],
                   ["patch", job, status], ["get", job, status], ["create", "services"],
                   ["create", "serviceaccounts"], ["create", "roles"], ["create", "rolebindings"], ["create", "secrets"],
                   ["create", "events"], ["watch", "nodes"], ["list", "nodes"],
                   ["create", WORKLOADS], ["watch", WORKLOADS], ["patch", WORKLOADS], ["patch", WORKLOADS, status]]
        for verb_and_resource in allowed:
            assert can_i(kube_api, account, *verb_and_resource, *elsewhere), verb_and_resource
        assert can_i(kube_api, account, "watch", "customresourcedefinitions.apiextensions.k8s.io")
        assert can_i(kube_api, account, "get", f"workloadpriorityclasses.{KUEUE_GROUP}")
        assert can_i(kube_api, account, "get", f"resourceflavors.{KUEUE_GROUP}")
        for verb in ("get", "create", "update"):  # the Lease, in the release's namespace only
            assert can_i(kube_api, account, verb, "leases.coordination.k8s.io", "-n", namespace), verb
            assert not can_i(kube_api, account, verb, "leases.coordination.k8s.io", *elsewhere), verb
        refused = [["patch", job], ["update", "pods"], ["escalate", "roles"], ["bind", "roles"],
                   ["create", "pods", "--subresource=exec"], ["get", "secrets"], ["list", "secrets"],
                   ["update", "secrets"], ["delete", "secrets"]]
        for verb_and_resource in refused:
            assert not can_i(kube_api, account, *verb_and_resource, *elsewhere), verb_and_resource
        admission_policies = "validatingadmissionpolicies.admissionregistration.k8s.io"
        for cluster_wide in (["delete", "nodes"], ["list", "secrets", "-A"], ["create", "clusterroles"],
                             ["delete", admission_policies], ["create", admission_policies]):
            assert not can_i(kube_api, account, *cluster_wide), cluster_wide
    finally:
        helm("uninstall", release, "-n", namespace, "--wait", check=False)

    for kind, obj in objects.items():
        name = obj["metadata"]["name"]
        wait_until(lambda k=kind, n=name: live(kube_api, k, n, namespace) is None, 30, f"{kind} {name} to be deleted")


def run_and_restart(jobs, name: str) -> None:
    """A job of two ranks runs, a rank fails, and the gang runs again."""
    jobs.create(name, worldSize=2, backoffLimit=1)
    jobs.wait_phase(name, c.PHASE_RUNNING)
    jobs.finish(f"{name}-1", 137)
    jobs.wait_pods(name, 2, attempt=1)
    assert jobs.wait_phase(name, c.PHASE_RUNNING)["restarts"] == 1


@pytest.mark.parametrize("glob", [False, True], ids=["every-namespace", "a-glob"])
def test_operator_runs_under_the_charts_rbac(helm, kube_api, namespace, operator, jobs, tmp_path, glob: bool) -> None:
    """Cluster-wide, as the chart installs it; or serving a glob, which needs no more than that (no namespace
    list or watch: the ClusterRole has none)."""
    release = f"ddp-{uuid.uuid4().hex[:6]}"
    helm("install", release, str(CHART), "-n", namespace, "--skip-crds", *ON_FAKE_NODES)
    try:
        account = installed(helm, release, namespace)["ServiceAccount"]["metadata"]["name"]
        as_operator = kubeconfig_of(kube_api, account, namespace, operator.kubeconfig, tmp_path)

        admin, settings = operator.kubeconfig, operator.env
        operator.restart(kubeconfig=str(as_operator), env={ENV_NAMESPACES: glob_for(namespace)} if glob else {})
        try:
            # A job's whole life under the chart's RBAC: pods, service, progress identity, restart, events.
            run_and_restart(jobs, "least")
            assert {e.reason for e in jobs.events("least")} >= {c.REASON_ALL_READY, c.REASON_RANK_FAILED}
            # The progress Role it could only grant because the ClusterRole holds the same verbs.
            role = client.RbacAuthorizationV1Api(kube_api).read_namespaced_role("least-progress", namespace)
            assert role.rules[0].verbs == ["get", "patch"]
            # And the end of one: the TTL deletes the job.
            jobs.create("brief", worldSize=1, ttlSecondsAfterFinished=1)
            jobs.wait_phase("brief", c.PHASE_RUNNING)
            jobs.finish("brief-0", 0)
            wait_until(lambda: jobs.get("brief") is None, 20, "the TTL to delete the job")

            log = operator.log_path.read_text().split("--- restart ---")[-1]
            assert "Forbidden" not in log and "Not enough permissions" not in log, log[-3000:]
        finally:
            operator.restart(kubeconfig=admin, env=settings)
    finally:
        helm("uninstall", release, "-n", namespace, check=False)


def test_watch_namespaces_narrow_rbac_to_roles_in_each(helm) -> None:
    cluster_wide = render(helm)["ClusterRole"]["rules"]
    docs = render_all(helm, "--set", "watchNamespaces={team-a,team-b}")
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert env_of(deployment["spec"]["template"]["spec"]["containers"][0])[ENV_NAMESPACES] == "team-a,team-b"
    # Cluster-wide, only what is not namespaced: nodes (read), Kueue's priority classes and flavors (read)
    # and CRDs (for kopf).
    cluster_role = next(d for d in docs if d["kind"] == "ClusterRole")
    assert [rule["resources"] for rule in cluster_role["rules"]] == [
        ["nodes"], ["workloadpriorityclasses", "resourceflavors"], ["customresourcedefinitions"]]
    # Each namespace gets the rest of the cluster-wide rules, bound to the operator's account.
    roles = {d["metadata"]["namespace"]: d for d in docs if d["kind"] == "Role" and "leader" not in d["metadata"]["name"]}
    bindings = {d["metadata"]["namespace"]: d for d in docs
                if d["kind"] == "RoleBinding" and "leader" not in d["metadata"]["name"]}
    assert sorted(roles) == sorted(bindings) == ["team-a", "team-b"]
    assert roles["team-a"]["rules"] + cluster_role["rules"] == cluster_wide
    assert bindings["team-b"]["roleRef"]["name"] == roles["team-b"]["metadata"]["name"]
    assert bindings["team-b"]["subjects"] == [{"kind": "ServiceAccount", "name": "rel-ddp-operator", "namespace": "ops"}]


def test_multikueue_service_accounts_get_what_dispatching_ddpjobs_takes(helm) -> None:
    assert not any("multikueue" in d["metadata"]["name"] for d in render_all(helm))
    docs = render_all(helm, "--set", "multiKueue.serviceAccounts={kueue-system/kueue-controller-manager,mk/worker}")
    role = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-multikueue"))
    binding = next(d for d in docs if d["kind"] == "ClusterRoleBinding" and d["metadata"]["name"] == role["metadata"]["name"])
    assert {r["resources"][0]: set(r["verbs"]) for r in role["rules"]} == {
        "ddpjobs": {"get", "list", "watch", "create", "delete"}, "ddpjobs/status": {"get", "patch", "update"}}
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "namespace": "kueue-system", "name": "kueue-controller-manager"},
        {"kind": "ServiceAccount", "namespace": "mk", "name": "worker"}]
    refused = helm("template", "rel", str(CHART), "--set", "multiKueue.serviceAccounts={kueue-controller-manager}",
                   check=False)
    assert refused.returncode != 0 and "multiKueue/serviceAccounts" in refused.stderr, refused.stderr


def test_replicas_need_leader_election_and_election_can_be_off(helm) -> None:
    two = render(helm, "--set", "replicaCount=2")["Deployment"]
    assert two["spec"]["replicas"] == 2
    refused = helm("template", "rel", str(CHART), "--set", "replicaCount=2", "--set", "leaderElection.enabled=false",
                   check=False)
    assert refused.returncode != 0 and "needs leaderElection.enabled" in refused.stderr, refused.stderr
    alone = render(helm, "--set", "leaderElection.enabled=false")
    assert alone["Deployment"]["spec"]["strategy"]["type"] == "Recreate" and "Role" not in alone
    assert ENV_LEASE_NAME not in env_of(alone["Deployment"]["spec"]["template"]["spec"]["containers"][0])
    bad = helm("template", "rel", str(CHART), "--set", "leaderElection.renewDeadline=20", check=False)
    assert bad.returncode != 0 and "retryPeriod < renewDeadline < leaseDuration" in bad.stderr, bad.stderr


def test_metrics_service_and_service_monitor_are_off_by_default_and_render_when_asked(helm) -> None:
    assert not {"Service", "ServiceMonitor"} & set(render(helm))
    objects = render(helm, "--set", "metrics.port=9100", "--set", "metrics.service.enabled=true",
                     "--set", "metrics.service.port=9200", "--set", "metrics.serviceMonitor.enabled=true",
                     "--set", "metrics.serviceMonitor.interval=15s", "--set", "metrics.serviceMonitor.labels.release=prom")
    container = objects["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "metrics", "containerPort": 9100} in container["ports"]
    assert env_of(container)[ENV_METRICS_PORT] == "9100"
    service = objects["Service"]["spec"]
    assert service["ports"] == [{"name": "metrics", "port": 9200, "targetPort": "metrics"}]
    assert service["selector"] == objects["Deployment"]["spec"]["selector"]["matchLabels"]
    monitor = objects["ServiceMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1" and monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "15s", "honorLabels": True}]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= objects["Service"]["metadata"]["labels"].items()
    refused = helm("template", "rel", str(CHART), "--set", "metrics.serviceMonitor.enabled=true", check=False)
    assert refused.returncode != 0 and "needs metrics.service.enabled" in refused.stderr, refused.stderr


def test_a_release_for_one_namespace_runs_the_operator_there_only_with_its_lease(
        helm, kube_api, namespace, operator, jobs, tmp_path) -> None:
    release = f"ddp-{uuid.uuid4().hex[:6]}"
    helm("install", release, str(CHART), "-n", namespace, "--skip-crds", *ON_FAKE_NODES,
         "--set", f"watchNamespaces={{{namespace}}}")
    try:
        objects = installed(helm, release, namespace)
        account_name = objects["ServiceAccount"]["metadata"]["name"]
        account = f"system:serviceaccount:{namespace}:{account_name}"
        job, here, elsewhere = f"{api.PLURAL}.{api.GROUP}", ["-n", namespace], ["-n", "any-namespace"]
        for verb_and_resource in (["create", "pods"], ["watch", "pods"], ["watch", job], ["create", "roles"],
                                  ["watch", WORKLOADS], ["patch", WORKLOADS, "--subresource=status"]):
            assert can_i(kube_api, account, *verb_and_resource, *here), verb_and_resource
            assert not can_i(kube_api, account, *verb_and_resource, *elsewhere), verb_and_resource
        assert can_i(kube_api, account, "watch", "nodes") and not can_i(kube_api, account, "list", "pods", "-A")
        assert not can_i(kube_api, account, "list", "namespaces")
        assert can_i(kube_api, account, "update", "leases.coordination.k8s.io", *here)

        settings = operator_settings(objects)
        admin, session = operator.kubeconfig, operator.env
        operator.restart(kubeconfig=str(kubeconfig_of(kube_api, account_name, namespace, admin, tmp_path)),
                         env=settings)
        try:
            run_and_restart(jobs, "scoped")
            lease = client.CoordinationV1Api(kube_api).read_namespaced_lease(settings[ENV_LEASE_NAME], namespace)
            assert lease.spec.holder_identity == "test"
            log = operator.log_path.read_text().split("--- restart ---")[-1]
            assert "Forbidden" not in log and "Not enough permissions" not in log, log[-3000:]
        finally:
            operator.restart(kubeconfig=admin, env=session)
    finally:
        helm("uninstall", release, "-n", namespace, check=False)
