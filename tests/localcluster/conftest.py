"""Fixtures of the tests on the local cluster's real node."""

from __future__ import annotations

import pytest
from kubernetes import client

from kube import Cluster
from realnode import import_busybox, the_real_node


@pytest.fixture(scope="session")
def real_node(cluster: Cluster, kube_api) -> client.V1Node:
    if not cluster.local:
        pytest.fail("these tests import their image into the local cluster's node; unset DDP_TEST_KUBECONFIG")
    return the_real_node(kube_api)


@pytest.fixture(scope="session")
def busybox_image(real_node: client.V1Node, tmp_path_factory: pytest.TempPathFactory) -> str:
    return import_busybox(tmp_path_factory.mktemp("busybox-rootfs"))
