"""Shared fixtures: the Kubernetes cluster the tests use and a fresh namespace per test."""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ddp_operator.config import ENV_NAMESPACES
from kube import (
    REPO,
    Cluster,
    Jobs,
    OperatorProcess,
    cluster_script,
    install_crd,
    open_cluster,
    own_namespace_in,
    wait_until,
)
from kueue import Queues, start_kueue, stop_kueue
from realnode import import_busybox, the_real_node
from registry import Registry, start_registry, stop_registry
from testnodes import NodeMaker

# Every namespace this test session creates starts with this, and its operator serves only those: test
# sessions sharing one cluster (several clones, CI) never act on each other's jobs.
SESSION_PREFIX = f"t-{uuid.uuid4().hex[:4]}-"


@pytest.fixture(autouse=True)
def progress_file_of_the_test(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0's progress file (DDP_PROGRESS_FILE, /tmp/ddp-progress.json outside a pod) in the test's own
    folder, for the ranks its subprocesses start too, unless the test names one."""
    monkeypatch.setenv("DDP_PROGRESS_FILE", str(tmp_path / "ddp-progress.json"))


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    # An xdist worker knows `--dist loadgroup` as its option `loadgroup` (its own `dist` is "no").
    if os.environ.get("PYTEST_XDIST_WORKER") and not request.config.getoption("loadgroup", False):
        pytest.fail("the tests on the cluster must run in one pytest-xdist worker: pass --dist loadgroup (as `make "
                    "test` does), or leave them out with -m 'not cluster and not images'", pytrace=False)
    found = open_cluster()
    yield found
    if found.started_here:
        cluster_script("down", check=False)


@pytest.fixture(scope="session")
def kube_api(cluster: Cluster):
    from ddp_contract import kubeclient

    client = kubeclient.api_client(cluster.kubeconfig)
    yield client
    client.close()


@pytest.fixture
def kubectl(cluster: Cluster):
    """Runs kubectl against the test cluster and returns the completed process (check=True)."""

    def run(*args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            [cluster.kubectl, "--kubeconfig", cluster.kubeconfig, *args],
            input=input,
            capture_output=True,
            text=True,
            check=check,
        )

    return run


@pytest.fixture
def namespace(kube_api, request) -> Iterator[str]:
    from kubernetes import client

    core = client.CoreV1Api(kube_api)
    base = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    name = f"{SESSION_PREFIX}{base}-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": name, "labels": {"ddp-operator-test": "true"}}})
    # Pods are refused until the controller-manager has made the namespace's default ServiceAccount.
    wait_until(lambda: core.list_namespaced_service_account(name).items, 30, f"default ServiceAccount in {name}")
    yield name
    core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture(scope="session")
def crd(kube_api) -> None:
    install_crd(kube_api)


@pytest.fixture(scope="session")
def operator(cluster: Cluster, crd: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    handle = OperatorProcess(cluster.kubeconfig, tmp_path_factory.mktemp("operator") / "operator.log",
                             env={ENV_NAMESPACES: f"{SESSION_PREFIX}*"})
    handle.start()
    yield handle
    handle.stop()
    # The operator's own exceptions, not a rank's traceback quoted in a status message it logs.
    log = handle.log_path.read_text()
    assert not re.search(r"^Traceback \(most recent call last\):", log, re.MULTILINE), log[-5000:]


@pytest.fixture
def jobs(kube_api, namespace: str, operator: OperatorProcess) -> Jobs:
    return Jobs(kube_api, namespace)


@pytest.fixture(scope="session")
def images_on_the_node(cluster: Cluster, real_node) -> None:
    """`make images`: builds what changed and loads both images into the real node's containerd (once
    it answers: a cluster just started may not have it up yet, and the build then only makes tarballs)."""
    wait_until(lambda: cluster_script("ctr", "version", check=False).returncode == 0, 120, "the node's containerd")
    result = subprocess.run(["bash", str(REPO / "images" / "build.sh"), "build"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    listed = cluster_script("ctr", "images", "ls", "-q").stdout
    assert "docker.io/ddp-operator/operator:" in listed and "docker.io/ddp-operator/trainer:" in listed, \
        f"{listed}\n{result.stderr[-3000:]}"


@pytest.fixture(scope="session")
def real_node(cluster: Cluster, kube_api):
    """The local cluster's node with a kubelet and containerd, where pods run in real containers."""
    if not cluster.local:
        pytest.fail("these tests import their image into the local cluster's node; unset DDP_TEST_KUBECONFIG")
    return the_real_node(kube_api)


@pytest.fixture
def pool_label(jobs: Jobs, kube_api, real_node) -> Iterator[tuple[str, str]]:
    """A label of this test's own on the real node, which its job selects: taken off, the node holds none
    of the job's new pods (as if its capacity were gone); its running pods stay. Removed afterwards."""
    from kubernetes import client

    core = client.CoreV1Api(kube_api)
    key, value = "ddp-operator-test/pool", jobs.namespace[-63:]
    core.patch_node(real_node.metadata.name, {"metadata": {"labels": {key: value}}})
    try:
        yield key, value
    finally:
        core.patch_node(real_node.metadata.name, {"metadata": {"labels": {key: None}}})


@pytest.fixture(scope="session")
def busybox_image(real_node, tmp_path_factory: pytest.TempPathFactory) -> str:
    return import_busybox(tmp_path_factory.mktemp("busybox-rootfs"))


@pytest.fixture(scope="module")
def private_registry(real_node, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A registry with TLS and basic auth on the real node's gateway (localcluster/registry.sh), which
    the node trusts while it runs; stopped at the end, with the node's images pulled from it (a
    watchdog stops it should the test process die first)."""
    registry = start_registry(tmp_path_factory.mktemp("registry"))
    yield registry
    stop_registry(registry)


@pytest.fixture
def own_namespace(kube_api) -> Iterator[str]:
    """A namespace of the test's own, outside the test session's operator's (`t-<session>-*`): for an
    operator the test installs itself."""
    with own_namespace_in(kube_api) as name:
        yield name


@pytest.fixture
def own_nodes(kube_api) -> Iterator[NodeMaker]:
    """Nodes of the test's own (gpu-node-test-<id>), deleted afterwards: the shared ones stay untouched."""
    maker = NodeMaker(kube_api)
    yield maker
    maker.cleanup()


@pytest.fixture(scope="session")
def kueue(cluster: Cluster) -> Iterator[None]:
    """Kueue on the local control plane (localcluster/kueue.sh), stopped at the end if started here."""
    if not cluster.local:
        pytest.skip("Kueue is started on the local control plane only")
    started = start_kueue()
    yield
    if started:
        stop_kueue()


@pytest.fixture
def queues(kube_api, namespace: str, kueue: None, jobs: Jobs) -> Iterator[Queues]:
    """The test's Kueue queues; deleted, with its jobs' Workloads, while Kueue still runs."""
    made = Queues(kube_api, namespace)
    yield made
    made.cleanup(jobs)


# With PYTEST_WORKERS=2, `make test` runs two pytest-xdist workers with --dist loadgroup: the tests on the
# cluster and those building the images in one lane, in the order of a single session (they share one
# cluster, its real node, Kueue and BuildKit), the others a module at a time on the other worker. The
# cluster's fixtures assume that one lane: `cluster` refuses other ways of spreading them over workers.
CLUSTER_LANE = "cluster"


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the lanes
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        # Every test that touches the cluster is marked, so `-m "not cluster"` runs the fast ones alone.
        if "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)
        on_cluster = item.get_closest_marker("cluster") or item.get_closest_marker("images")
        item.add_marker(pytest.mark.xdist_group(CLUSTER_LANE if on_cluster else item.nodeid.split("::")[0]))


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's, on its controller
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """xdist's loadgroup groups tests by a suffix (`@<group>`) its workers write into their node ids;
    pytest 9.2 drops it (pytest-xdist#1386), and the cluster's tests would run on both workers at once."""
    ungrouped = [nodeid for nodeid in ids if "@" not in nodeid]
    if node.config.getoption("dist") == "loadgroup" and ungrouped:
        pytest.exit(f"pytest-xdist did not group {len(ungrouped)} tests into lanes ({ungrouped[0]}, ...): this pytest "
                    "loses their xdist_group marks (pytest-xdist#1386); use requirements/test.txt's pins",
                    returncode=pytest.ExitCode.USAGE_ERROR)
