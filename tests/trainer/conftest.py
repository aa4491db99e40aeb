"""Fixtures for the trainer runtime tests: a real S3 server (SeaweedFS) on loopback, rank launchers.

The helpers the tests import by name are in trainerhelp.py (a plain module).
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # trainerhelp, ddp_workloads (the code the ranks run)

from trainerhelp import ACCESS_KEY, SECRET_KEY

import demo  # localcluster/demo.py: its S3 server
from linkproxy import LinkProxy


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    with demo.s3_server(0) as endpoint:  # the S3 server every test tier and `make demo` use
        yield endpoint


@pytest.fixture
def s3_env(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """S3 settings in this process's environment (and to hand to subprocesses)."""
    from ddp_trainer.storage import s3

    values = {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "DDP_S3_ENDPOINT": s3_endpoint,
        "DDP_S3_REGION": "us-east-1",
        "DDP_S3_MAX_ATTEMPTS": "3",
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    s3.reset_clients()
    yield values
    s3.reset_clients()


@pytest.fixture
def bucket(s3_env: dict[str, str]) -> Iterator[str]:
    from ddp_trainer.storage import s3

    name = f"test-{uuid.uuid4().hex[:12]}"
    s3.client().create_bucket(Bucket=name)
    yield name
    # Each bucket is a collection with a volume of its own on the server: hundreds of tests would fill it.
    try:
        s3.delete_keys(name, [key for key, _ in s3.list_objects(s3.S3Url(name, ""))])
        s3.client().delete_bucket(Bucket=name)
    except Exception as error:  # noqa: BLE001 - a test that changed the S3 settings; the server goes anyway
        print(f"bucket {name} left on the test server: {error}")


@pytest.fixture
def s3_outage(bucket: str, s3_env: dict[str, str], s3_endpoint: str,
              monkeypatch: pytest.MonkeyPatch) -> Iterator[LinkProxy]:
    """This process's S3 through a proxy on loopback that stands for the network: `down()` for an outage
    (each connection closed at once), `refusing = False` for S3 to answer again. `bucket` is made."""
    from ddp_trainer.storage import s3

    proxy = LinkProxy(s3_endpoint)
    monkeypatch.setenv("DDP_S3_ENDPOINT", proxy.url)
    monkeypatch.setenv("DDP_S3_MAX_ATTEMPTS", "1")  # each write fails at once: the waits are the code's own
    s3.reset_clients()
    yield proxy
    proxy.close()
    monkeypatch.setenv("DDP_S3_ENDPOINT", s3_endpoint)  # for the bucket's removal
    s3.reset_clients()
