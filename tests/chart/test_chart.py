"""The Helm chart: the CRD copy, lint and values schema, the install, and the operator running under its RBAC."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from ddp_contract import api
from ddp_operator import constants as c
from kube import REPO, Cluster, cluster_script, wait_until

CHART = REPO / "charts"
SYNC = Path("scripts") / "sync-crds.sh"
CHART_CRD = Path("charts") / "crds" / "ddpjob.yaml"
KINDS = ["ClusterRole", "ClusterRoleBinding", "Deployment", "ServiceAccount"]


@pytest.fixture(scope="module")
def helm(cluster: Cluster):
    binary = cluster_script("bindir").stdout.strip().split(":")[1] + "/helm" if cluster.local else "helm"

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([binary, "--kubeconfig", cluster.kubeconfig, *args], capture_output=True, text=True,
                              check=check)

    return run


def render(helm, *args: str, namespace: str = "ops") -> dict[str, dict[str, Any]]:
    """The chart's objects by kind."""
    docs = yaml.safe_load_all(helm("template", "rel", str(CHART), "-n", namespace, *args).stdout)
    return {doc["kind"]: doc for doc in docs if doc}


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
    drifted.write_text(drifted.read_text().replace("maximum: 4096", "maximum: 8192"))
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
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == "ddp-operator/operator:0.1.0"  # the tag defaults to appVersion
    assert container["command"] == ["python", "-m", "ddp_operator"]
    # The probe asks kopf's endpoint where DDP_OPERATOR_LIVENESS told kopf to serve it.
    env = {e["name"]: e["value"] for e in container["env"]}
    probe = container["livenessProbe"]["httpGet"]
    port = next(p["containerPort"] for p in container["ports"] if p["name"] == probe["port"])
    assert env["DDP_OPERATOR_LIVENESS"] == f"http://0.0.0.0:{port}{probe['path']}"
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
])
def test_schema_refuses_unknown_and_bad_values(helm, setting: str, named: str) -> None:
    refused = helm("template", "rel", str(CHART), "--set", setting, check=False)
    assert refused.returncode != 0 and named in refused.stderr, refused.stderr


def test_cluster_scoped_names_differ_between_namespaces(helm) -> None:
    for kind in ("ClusterRole", "ClusterRoleBinding"):
        names = {render(helm, namespace=ns)[kind]["metadata"]["name"] for ns in ("team-a", "team-b")}
        assert len(names) == 2 and all("team-" in name for name in names), names


def can_i(kubectl, account: str, *args: str) -> bool:
    result = kubectl("auth", "can-i", *args, "--as", account, check=False)
    return result.stdout.strip() == "yes"


def installed(helm, release: str, namespace: str) -> dict[str, dict[str, Any]]:
    """The release's objects by kind, as Helm recorded them."""
    docs = yaml.safe_load_all(helm("get", "manifest", release, "-n", namespace).stdout)
    return {doc["kind"]: doc for doc in docs if doc}


def live(kube_api, kind: str, name: str, namespace: str) -> Any:
    """The object as the API server has it, or None."""
    rbac, core, apps = client.RbacAuthorizationV1Api(kube_api), client.CoreV1Api(kube_api), client.AppsV1Api(kube_api)
    read = {
        "ClusterRole": lambda: rbac.read_cluster_role(name),
        "ClusterRoleBinding": lambda: rbac.read_cluster_role_binding(name),
        "Deployment": lambda: apps.read_namespaced_deployment(name, namespace),
        "ServiceAccount": lambda: core.read_namespaced_service_account(name, namespace),
    }[kind]
    try:
        return read()
    except client.ApiException as error:
        if error.status == 404:
            return None
        raise


def test_install_grants_the_operator_what_it_needs_and_uninstall_removes_it(
        helm, kubectl, kube_api, crd, namespace) -> None:
    # crd: the CRD is installed cluster-wide (tests share it), hence --skip-crds.
    release = f"ddp-{uuid.uuid4().hex[:6]}"
    result = helm("install", release, str(CHART), "-n", namespace, "--skip-crds")
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
                   ["create", "serviceaccounts"], ["create", "roles"], ["create", "rolebindings"],
                   ["create", "events"], ["watch", "nodes"], ["list", "nodes"]]
        for verb_and_resource in allowed:
            assert can_i(kubectl, account, *verb_and_resource, *elsewhere), verb_and_resource
        assert can_i(kubectl, account, "watch", "customresourcedefinitions.apiextensions.k8s.io")
        refused = [["patch", job], ["update", "pods"], ["escalate", "roles"], ["bind", "roles"],
                   ["create", "pods", "--subresource=exec"], ["get", "secrets"]]
        for verb_and_resource in refused:
            assert not can_i(kubectl, account, *verb_and_resource, *elsewhere), verb_and_resource
        for cluster_wide in (["delete", "nodes"], ["list", "secrets", "-A"], ["create", "clusterroles"]):
            assert not can_i(kubectl, account, *cluster_wide), cluster_wide
    finally:
        helm("uninstall", release, "-n", namespace, "--wait", check=False)

    for kind, obj in objects.items():
        name = obj["metadata"]["name"]
        wait_until(lambda k=kind, n=name: live(kube_api, k, n, namespace) is None, 30, f"{kind} {name} to be deleted")


def test_operator_runs_under_the_charts_rbac(helm, kube_api, namespace, operator, jobs, tmp_path) -> None:
    release = f"ddp-{uuid.uuid4().hex[:6]}"
    helm("install", release, str(CHART), "-n", namespace, "--skip-crds")
    try:
        account = installed(helm, release, namespace)["ServiceAccount"]["metadata"]["name"]
        core = client.CoreV1Api(kube_api)
        token = core.create_namespaced_service_account_token(
            account, namespace, {"spec": {"expirationSeconds": 3600}}).status.token
        config = yaml.safe_load(Path(operator.kubeconfig).read_text())
        config["users"] = [{"name": "operator", "user": {"token": token}}]
        config["contexts"][0]["context"]["user"] = "operator"
        as_operator = tmp_path / "operator.kubeconfig"
        as_operator.write_text(yaml.safe_dump(config))

        admin = operator.kubeconfig
        operator.restart(kubeconfig=str(as_operator))
        try:
            # A job's whole life under the chart's RBAC: pods, service, progress identity, restart, events.
            jobs.create("least", worldSize=2, backoffLimit=1)
            jobs.wait_phase("least", c.PHASE_RUNNING)
            jobs.finish("least-1", 137)
            jobs.wait_pods("least", 2, attempt=1)
            assert jobs.wait_phase("least", c.PHASE_RUNNING)["restarts"] == 1
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
            operator.restart(kubeconfig=admin)
    finally:
        helm("uninstall", release, "-n", namespace, check=False)
