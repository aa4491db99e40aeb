"""The Helm chart for the tests that install it: Helm against the test cluster, and what a release holds."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from ddp_operator.config import ENV_IDENTITY, ENV_METRICS_ADDRESS, ENV_METRICS_PORT
from fakenodes import FAKE_NODE_SELECTOR, FAKE_NODE_TOLERATION
from kube import REPO, Cluster, Jobs, cluster_script, env_of

CHART = REPO / "charts"
# The release's operator pods (the Deployment's pod template labels).
OPERATOR_PODS = "app.kubernetes.io/name=ddp-operator"
Helm = Callable[..., subprocess.CompletedProcess]

# The release's own operator pod goes to kwok's fake nodes, which fake it Running: on the real node,
# with the operator image loaded there, it would really run and act (and take the Lease) beside the
# operator process each test runs itself.
ON_FAKE_NODES = ("--set-json", f"nodeSelector={json.dumps(FAKE_NODE_SELECTOR)}",
                 "--set-json", f"tolerations={json.dumps([FAKE_NODE_TOLERATION])}")


def helm_for(cluster: Cluster) -> Helm:
    """helm(*args, check=True): the cluster's Helm (the local control plane's build, else helm on PATH)."""
    binary = cluster_script("bindir").stdout.strip().split(":")[1] + "/helm" if cluster.local else "helm"

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([binary, "--kubeconfig", cluster.kubeconfig, *args], capture_output=True, text=True,
                              check=check)

    return run


def offline_helm() -> Helm | None:
    """helm(*args, check=True) for what needs no cluster (`template`, `lint`): the local control plane's
    build where cluster.sh made it, else helm on PATH; None without either."""
    built = Path(cluster_script("bindir").stdout.strip().split(":")[1]) / "helm"
    binary = str(built) if built.is_file() else shutil.which("helm")
    if binary is None:
        return None

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([binary, *args], capture_output=True, text=True, check=check)

    return run


def installed(helm: Helm, release: str, namespace: str) -> dict[str, dict[str, Any]]:
    """The release's objects by kind, as Helm recorded them."""
    docs = yaml.safe_load_all(helm("get", "manifest", release, "-n", namespace).stdout)
    return {doc["kind"]: doc for doc in docs if doc}


def render_all(helm: Helm, *args: str, namespace: str = "ops") -> list[dict[str, Any]]:
    """`helm template rel charts/ -n NAMESPACE ARGS...`: the chart's objects."""
    docs = yaml.safe_load_all(helm("template", "rel", str(CHART), "-n", namespace, *args).stdout)
    return [doc for doc in docs if doc]


def render(helm: Helm, *args: str, namespace: str = "ops") -> dict[str, dict[str, Any]]:
    """The chart's objects by kind (the last of each kind)."""
    return {doc["kind"]: doc for doc in render_all(helm, *args, namespace=namespace)}


def operator_settings(objects: dict[str, dict[str, Any]], identity: str = "test") -> dict[str, str]:
    """The release's operator settings for the test's own operator process: the Deployment's, but for
    where /metrics listens (the process keeps loopback and a free port: 8080 may be another test's) and
    the identity (the pod's name there)."""
    container = objects["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    settings = {k: v for k, v in env_of(container).items() if k not in (ENV_METRICS_ADDRESS, ENV_METRICS_PORT)}
    return {**settings, ENV_IDENTITY: identity}


def ready_operators(jobs: Jobs) -> list[client.V1Pod]:
    """The release's operator pods in the jobs' namespace that run, are Ready and are not going away."""
    return [p for p in jobs.core.list_namespaced_pod(jobs.namespace, label_selector=OPERATOR_PODS).items
            if p.metadata.deletion_timestamp is None and p.status.phase == "Running"
            and all(s.ready for s in p.status.container_statuses or [])]
