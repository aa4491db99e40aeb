"""Fixtures of the command jobs on the real node (test_real_node_commands.py, test_real_node_kept.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client

import demo
import lanes
from commandjobs import BUCKET, build_frameworks_image, frameworks_image_name
from realnode import node_address


@pytest.fixture(scope="module")
def frameworks_image(images_on_the_node: None) -> str:
    """The frameworks image in the node, built once a test run whichever module needs it first."""
    lanes.once("frameworks-image", build_frameworks_image)
    return frameworks_image_name()


@pytest.fixture(scope="module")
def commands_s3(real_node: client.V1Node) -> Iterator[str]:
    """An S3 server of the module's own on the node's bridge address, with the bucket the command jobs use."""
    with demo.s3_server(0, buckets=(BUCKET,), host=node_address(real_node)) as endpoint:
        yield endpoint
