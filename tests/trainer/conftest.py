"""Fixtures for the trainer runtime tests: a real S3 server (moto) on loopback, rank launchers.

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

import demo  # localcluster/demo.py: its S3 server (moto on loopback)


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
def bucket(s3_env: dict[str, str]) -> str:
    from ddp_trainer.storage import s3

    name = f"test-{uuid.uuid4().hex[:12]}"
    s3.client().create_bucket(Bucket=name)
    return name
