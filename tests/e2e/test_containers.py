"""The quick start as a user runs it on a real cluster, in a namespace that enforces the `restricted` Pod
Security Standard: the chart's operator pod from its image, the quick-start DDPJob's ranks (unchanged,
non-root by default) in trainer-image containers on the local cluster's real node, rank 0 found
through the headless Service and cluster DNS, progress written from the pod, `kubectl logs` on a
rank, and `helm uninstall` removing what it installed. Select with `pytest -m node`."""

from __future__ import annotations

import re
import subprocess
from ipaddress import ip_address, ip_network
from pathlib import Path

import pytest
from kubernetes import client

from ddp_operator import constants as c
from e2e.test_quickstart import COLUMNS, quick_start_commands, user_shell
from helmchart import OPERATOR_PODS, ready_operators
from kube import REPO, Cluster, Jobs, wait_until

pytestmark = [pytest.mark.node, pytest.mark.images, pytest.mark.timeout(3600)]


def test_the_quick_start_runs_in_containers_from_our_images(
        cluster: Cluster, kube_api, images_on_the_node: None, own_namespace: str, tmp_path: Path) -> None:
    install, apply, get = quick_start_commands()
    env = user_shell(cluster, own_namespace, tmp_path)

    def run(command: str) -> str:
        result = subprocess.run(command, shell=True, cwd=REPO, env=env, capture_output=True, text=True)
        assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
        return result.stdout

    jobs = Jobs(kube_api, own_namespace)
    jobs.core.patch_namespace(own_namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})
    # The release serves its own namespace only, so it never acts on other tests' jobs.
    run(f"{install} -n {own_namespace} --set 'watchNamespaces={{{own_namespace}}}'")
    try:
        operator = wait_until(lambda: ready_operators(jobs), 180, "the operator's pod to be Ready")[0]  # type: ignore[index]
        assert operator.spec.containers[0].image.startswith("ddp-operator/operator:")
        assert run(apply).strip() == "ddpjob.ddpoperator.io/quickstart created"
        status = jobs.wait_phase("quickstart", c.PHASE_SUCCEEDED, timeout=600)
        assert status["restarts"] == 0 and status["progress"]["epoch"] == 7, status
        assert status["rendezvous"]["allReduceMillis"] > 0

        header, row = [line.split() for line in run(get).splitlines()]
        assert header == COLUMNS and row[:3] == ["quickstart", "Succeeded", "0/2"] and "AllRanksSucceeded" in row, row
        subnet = ip_network(jobs.core.read_node(operator.spec.node_name).spec.pod_cidr)
        for rank in (0, 1):
            pod = jobs.core.read_namespaced_pod(f"quickstart-{rank}", own_namespace)
            assert pod.spec.node_name == operator.spec.node_name and ip_address(pod.status.pod_ip) in subnet
            assert pod.spec.containers[0].image.startswith("ddp-operator/trainer:")
            assert pod.spec.security_context.run_as_non_root is True  # the image's uid 1000 trained
        said = run(f"kubectl logs quickstart-0 -n {own_namespace}")
        accuracy = float(re.search(r"accuracy after training ([0-9.]+)", said).group(1))  # type: ignore[union-attr]
        assert accuracy > 0.9, said[-2000:]
    finally:
        run(f"helm uninstall ddp-operator -n {own_namespace}")
    wait_until(lambda: not jobs.core.list_namespaced_pod(own_namespace, label_selector=OPERATOR_PODS).items,
               120, "helm uninstall to remove the operator")
    roles = client.RbacAuthorizationV1Api(kube_api).list_namespaced_role(own_namespace).items
    left = [r.metadata.name for r in roles if r.metadata.name.startswith("ddp-operator")]
    assert not left, left
