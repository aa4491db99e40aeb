"""The runtime's S3 paths against a store that predates AWS's 2025 checksum defaults (strictstore.py in
front of the real server): with a custom endpoint the clients send checksums only where S3's API
requires one, as Content-MD5, so every request goes through; boto3's defaults are refused there."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator

import pytest

from ddp_contract import envnames
from ddp_trainer.errors import TrainerError
from ddp_trainer.storage import s3
from ddp_trainer.storage.readahead import open_readahead
from strictstore import StrictStore, strict_store

MB = 1024 * 1024


@pytest.fixture
def strict(s3_env: dict[str, str], bucket: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[StrictStore]:
    """This process's S3 settings pointed at a strict store in front of the test server."""
    with strict_store(s3_env[envnames.S3_ENDPOINT]) as (endpoint, store):
        monkeypatch.setenv(envnames.S3_ENDPOINT, endpoint)
        s3.reset_clients()
        yield store
    monkeypatch.setenv(envnames.S3_ENDPOINT, s3_env[envnames.S3_ENDPOINT])  # the bucket goes through the server
    s3.reset_clients()


def test_boto3_s_defaults_are_refused_there(strict: StrictStore, bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(envnames.S3_CHECKSUMS, "when_supported")
    s3.reset_clients()
    with pytest.raises(TrainerError, match=f"s3://{bucket}/refused"):
        s3.put_bytes(s3.S3Url(bucket, "refused"), b"x")
    assert strict.refused and {code for _, _, code in strict.refused} == {"InvalidArgument"}, strict.refused


def test_objects_multipart_uploads_ranged_reads_listing_and_batch_deletes_go_through(
        strict: StrictStore, bucket: str) -> None:
    small = s3.S3Url(bucket, "run/small.json")
    s3.put_bytes(small, b'{"step": 1}', content_type="application/json")
    assert s3.get_bytes(small) == b'{"step": 1}' and s3.head(small)["ContentLength"] == 11
    blob = os.urandom(11 * MB)
    large = s3.S3Url(bucket, "run/checkpoint.pt")
    s3.upload_fileobj(io.BytesIO(blob), large, part_size=5 * MB)  # 3 parts
    with open_readahead(large) as reader:
        assert reader.read() == blob
    assert sorted(key for key, _ in s3.list_objects(s3.S3Url(bucket, "run"))) == ["run/checkpoint.pt", "run/small.json"]
    s3.delete_keys(bucket, ["run/checkpoint.pt", "run/small.json"])
    assert list(s3.list_objects(s3.S3Url(bucket, "run"))) == []
    assert strict.refused == [] and strict.forwarded >= 9
