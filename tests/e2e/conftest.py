"""End-to-end fixtures: an S3 server (SeaweedFS on loopback) holding a small image dataset, and the pod
runner that plays the kubelet by running each rank as a local process."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2ehelp import BUCKET
from kube import REPO

sys.path.insert(0, str(REPO / "localcluster"))
import demo


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with demo.s3_server(0, buckets=(BUCKET,)) as endpoint:
        demo.upload_dataset(demo.s3_client(endpoint), BUCKET, "shapes/train", per_class=48)
        yield endpoint


@pytest.fixture(scope="module")
def podrunner(cluster, operator, tmp_path_factory) -> Iterator[Path]:
    log_dir = tmp_path_factory.mktemp("podrunner")
    runner = demo.Background("podrunner", [sys.executable, str(REPO / "localcluster" / "podrunner.py"),
                                           "--kubeconfig", cluster.kubeconfig, "--log-dir", str(log_dir)], log_dir)
    yield log_dir
    runner.stop()
