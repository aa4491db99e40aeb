"""Shared fixtures: the Kubernetes cluster the tests use and a fresh namespace per test."""

from __future__ import annotations

import os
import re
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import lanes
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
from racks import racks
from realnode import IMAGE as BUSYBOX_IMAGE
from realnode import import_busybox, the_real_node
from registry import Registry, start_registry, stop_registry
from testnodes import NodeMaker

# Every namespace this test session creates starts with this, and its operator serves only those: test
# sessions sharing one cluster (several clones, CI) never act on each other's jobs.
SESSION_PREFIX = f"t-{uuid.uuid4().hex[:6]}-"


@pytest.fixture(autouse=True)
def progress_file_of_the_test(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0's progress file (DDP_PROGRESS_FILE, /tmp/ddp-progress.json outside a pod) in the test's own
    folder, for the ranks its subprocesses start too, unless the test names one."""
    monkeypatch.setenv("DDP_PROGRESS_FILE", str(tmp_path / "ddp-progress.json"))


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Cluster:
    # An xdist worker knows `--dist loadgroup` as its option `loadgroup` (its own `dist` is "no").
    if os.environ.get("PYTEST_XDIST_WORKER") and not request.config.getoption("loadgroup", False):
        pytest.fail("the tests on the cluster must run in pytest-xdist workers with --dist loadgroup (as `make "
                    "test` does), or be left out with -m 'not cluster and not images'", pytrace=False)
    lanes.once("cluster", lambda: open_cluster(lanes.owner_pid()).started_here)
    return open_cluster(lanes.owner_pid())


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
    lanes.once("crd", lambda: install_crd(kube_api))


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
    lanes.once("images", build_images_on_the_node)


def build_images_on_the_node() -> None:
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
    """A label of this test's own on the real node (a key of its own, as tests run beside each other), which
    its job selects: taken off, the node holds none of the job's new pods (as if its capacity were gone);
    its running pods stay. Removed afterwards."""
    from kubernetes import client

    core = client.CoreV1Api(kube_api)
    key, value = f"ddp-operator-test/pool-{uuid.uuid4().hex[:8]}", jobs.namespace[-63:]
    core.patch_node(real_node.metadata.name, {"metadata": {"labels": {key: value}}})
    try:
        yield key, value
    finally:
        core.patch_node(real_node.metadata.name, {"metadata": {"labels": {key: None}}})


@pytest.fixture(scope="session")
def busybox_image(real_node, tmp_path_factory: pytest.TempPathFactory) -> str:
    def load() -> None:
        import_busybox(tmp_path_factory.mktemp("busybox-rootfs"))

    lanes.once("busybox", load)
    return BUSYBOX_IMAGE


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
def kueue(cluster: Cluster) -> None:
    """Kueue on the local control plane (localcluster/kueue.sh), stopped at the run's end if started in it."""
    if not cluster.local:
        pytest.skip("Kueue is started on the local control plane only")
    lanes.once("kueue", lambda: start_kueue(lanes.owner_pid()))


@pytest.fixture
def rack(jobs: Jobs) -> Iterator[str]:
    """kwok's fake nodes labelled into two racks of two by a label of the test's own (tests/racks.py): its key."""
    with racks(jobs) as key:
        yield key


@pytest.fixture
def queues(kube_api, namespace: str, kueue: None, jobs: Jobs) -> Iterator[Queues]:
    """The test's Kueue queues; deleted, with its jobs' Workloads, while Kueue still runs."""
    made = Queues(kube_api, namespace)
    yield made
    made.cleanup(jobs)


# What the run started once for all its workers, and how its end stops it (tests/lanes.py).
STOPS: dict[str, Callable[[], object]] = {"kueue": stop_kueue, "cluster": lambda: cluster_script("down", check=False)}


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):
        lanes.begin_run()


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and lanes.RUN_DIR_ENV in os.environ:
        for name in reversed(lanes.started_in_run()):
            STOPS[name]()
        lanes.end_run()


def on_cluster(item: pytest.Item) -> bool:
    return bool(item.get_closest_marker("cluster") or item.get_closest_marker("images"))


ALONE_MODULE = lanes.AloneModule()


def module_of(item: pytest.Item | None) -> str | None:
    return None if item is None else item.nodeid.split("::")[0]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[object]:
    """A test on the cluster runs beside the other workers' ones, or alone with the rest of its module if
    the module is marked so."""
    started = time.time()
    try:
        if not on_cluster(item):
            return (yield)
        if item.get_closest_marker(lanes.ALONE) is None:
            with lanes.on_the_cluster(alone=False):
                return (yield)
        ALONE_MODULE.enter(str(module_of(item)))
        return (yield)
    finally:
        if ALONE_MODULE.module is not None and module_of(nextitem) != ALONE_MODULE.module:
            ALONE_MODULE.leave()
        lanes.log_test(item.nodeid, started, time.time())


# `make test` runs pytest-xdist workers (PYTEST_WORKERS) with --dist loadgroup: each module in one lane, in
# its order, since a module's fixtures are made once per worker; tests/lanes.py lets the modules on the
# cluster share it.
@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the lanes
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    lane_of: dict[str, str] = {}
    for item in items:
        # Every test that touches the cluster is marked, so `-m "not cluster"` runs the fast ones alone.
        if "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)
        lane_of[item.nodeid] = lanes.lane(str(module_of(item)), getattr(item, "fixturenames", ()))
        item.add_marker(pytest.mark.xdist_group(lane_of[item.nodeid]))
    alone = {lane_of[item.nodeid] for item in items if item.get_closest_marker(lanes.ALONE)}
    place = lanes.start_order(list(lane_of.values()), alone)
    items.sort(key=lambda item: place[lane_of[item.nodeid]])  # stable: each lane in its order


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's, on its controller
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """xdist's loadgroup groups tests by a suffix (`@<group>`) its workers write into their node ids;
    pytest 9.2 drops it (pytest-xdist#1386), and a module's tests would be spread over the workers."""
    ungrouped = [nodeid for nodeid in ids if "@" not in nodeid]
    if node.config.getoption("dist") == "loadgroup" and ungrouped:
        pytest.exit(f"pytest-xdist did not group {len(ungrouped)} tests into lanes ({ungrouped[0]}, ...): this pytest "
                    "loses their xdist_group marks (pytest-xdist#1386); use requirements/test.txt's pins",
                    returncode=pytest.ExitCode.USAGE_ERROR)
