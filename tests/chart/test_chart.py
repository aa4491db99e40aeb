"""The Helm chart: the CRD copy, lint and values schema, and the operator running under its RBAC."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from ddp_operator import constants as c
from kube import REPO, Cluster, cluster_script

CHART = REPO / "charts" / "ddp-operator"


@pytest.fixture(scope="module")
def helm(cluster: Cluster):
    binary = cluster_script("bindir").stdout.strip().split(":")[1] + "/helm" if cluster.local else "helm"

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([binary, "--kubeconfig", cluster.kubeconfig, *args], capture_output=True, text=True,
                              check=check)

    return run


def test_the_charts_crd_is_the_one_in_crds() -> None:
    result = subprocess.run(["bash", str(REPO / "scripts" / "sync-crds.sh"), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_sync_check_names_a_copy_that_drifted(tmp_path: Path) -> None:
    for part in ("crds", "charts/ddp-operator/crds", "scripts"):
        shutil.copytree(REPO / part, tmp_path / part)
    drifted = tmp_path / "charts/ddp-operator/crds/ddpjob.yaml"
    drifted.write_text(drifted.read_text().replace("maximum: 4096", "maximum: 8192"))
    result = subprocess.run(["bash", str(tmp_path / "scripts" / "sync-crds.sh"), "--check"], capture_output=True,
                            text=True)
    assert result.returncode == 1 and "charts/ddp-operator/crds/ddpjob.yaml differs" in result.stderr


def test_chart_lints_renders_and_refuses_unknown_values(helm) -> None:
    assert helm("lint", str(CHART)).returncode == 0
    rendered = list(yaml.safe_load_all(helm("template", "rel", str(CHART), "-n", "ops").stdout))
    kinds = sorted(doc["kind"] for doc in rendered if doc)
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "Deployment", "ServiceAccount"]
    deployment = next(doc for doc in rendered if doc and doc["kind"] == "Deployment")
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "ddp-operator/operator:0.1.0"

    refused = helm("template", "rel", str(CHART), "--set", "bogus=1", check=False)
    assert refused.returncode != 0 and "bogus" in refused.stderr
    refused = helm("template", "rel", str(CHART), "--set", "image.pullPolicy=Sometimes", check=False)
    assert refused.returncode != 0 and "pullPolicy" in refused.stderr


def can_i(kubectl, account: str, *args: str) -> bool:
    result = kubectl("auth", "can-i", *args, "--as", account, check=False)
    return result.stdout.strip() == "yes"


def test_operator_runs_under_the_charts_rbac(helm, kubectl, kube_api, namespace, operator, jobs, tmp_path) -> None:
    release = "ddp"
    helm("install", release, str(CHART), "-n", namespace, "--skip-crds", "--wait=false")
    try:
        account = f"system:serviceaccount:{namespace}:{release}-ddp-operator"
        assert can_i(kubectl, account, "create", "pods", "-n", "anywhere")
        assert can_i(kubectl, account, "patch", f"{c.PLURAL}.{c.GROUP}", "--subresource=status", "-n", "anywhere")
        assert can_i(kubectl, account, "create", "events", "-n", "anywhere")
        assert not can_i(kubectl, account, "delete", "nodes")
        assert not can_i(kubectl, account, "get", "secrets", "-n", "kube-system")
        assert not can_i(kubectl, account, "patch", f"{c.PLURAL}.{c.GROUP}", "-n", "anywhere")

        core = client.CoreV1Api(kube_api)
        token = core.create_namespaced_service_account_token(
            f"{release}-ddp-operator", namespace, {"spec": {"expirationSeconds": 3600}}).status.token
        config = yaml.safe_load(Path(operator.kubeconfig).read_text())
        config["users"] = [{"name": "operator", "user": {"token": token}}]
        config["contexts"][0]["context"]["user"] = "operator"
        as_operator = tmp_path / "operator.kubeconfig"
        as_operator.write_text(yaml.safe_dump(config))

        admin = operator.kubeconfig
        operator.restart(kubeconfig=str(as_operator))
        try:
            # A whole job's life under the chart's RBAC: pods, service, progress identity, restart, events.
            jobs.create("least", worldSize=2, backoffLimit=1)
            jobs.wait_phase("least", c.PHASE_RUNNING)
            jobs.finish("least-1", 137)
            jobs.wait_pods("least", 2, attempt=1)
            assert jobs.wait_phase("least", c.PHASE_RUNNING)["restarts"] == 1
            assert {e.reason for e in jobs.events("least")} >= {c.REASON_ALL_READY, c.REASON_RANK_FAILED}
            assert "Forbidden" not in operator.log_path.read_text().split("--- restart ---")[-1]
        finally:
            operator.restart(kubeconfig=admin)
    finally:
        helm("uninstall", release, "-n", namespace, check=False)


def test_operator_image_needs_only_what_its_dockerfile_copies(tmp_path: Path) -> None:
    """The Dockerfile copies the operator and four small modules of the runtime; that must suffice."""
    dockerfile = (REPO / "images" / "operator" / "Dockerfile").read_text().replace("\\\n", " ")
    for line in dockerfile.splitlines():
        if line.startswith("COPY "):
            *sources, destination = line.split()[1:]
            target = tmp_path / destination.removeprefix("/app/").rstrip("/")
            for source in sources:
                path = REPO / source
                if path.is_dir():
                    shutil.copytree(path, target)
                else:
                    target.mkdir(parents=True, exist_ok=True)
                    shutil.copy(path, target / path.name)
    probe = "import sys, ddp_operator.handlers; print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'boto3')))"
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True,
                            env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
