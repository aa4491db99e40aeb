"""The runtime's S3 paths against a store that predates AWS's 2025 checksum defaults (strictstore.py in
front of the real server): with a custom endpoint the clients send checksums only where S3's API
requires one, as Content-MD5, so every request goes through; boto3's defaults are refused there."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

import demo
import s3server
from ddp_client.store import ResultsPrefix, S3Access
from ddp_contract import envnames
from ddp_trainer.errors import ExitCode, ObjectNotFoundError, StorageError, TrainerError
from ddp_trainer.runtime.rankexit import classify
from ddp_trainer.storage import crtupload, s3
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


def test_an_https_store_signed_by_a_private_ca_is_trusted_through_its_ca_bundle(
        s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """spec.s3.caBundle mounts the file DDP_S3_CA_BUNDLE names: without it the store's certificate is
    refused; with it the runtime's and the client's clients write and read."""
    tls = s3server.make_certificate(tmp_path, "127.0.0.1")
    with s3server.seaweedfs(demo.ACCESS_KEY, demo.SECRET_KEY, tls=tls) as endpoint:
        monkeypatch.setenv(envnames.S3_ENDPOINT, endpoint)
        s3.reset_clients()
        with pytest.raises(StorageError, match="CERTIFICATE_VERIFY_FAILED.*spec.s3.caBundle \\(DDP_S3_CA_BUNDLE\\)") as refused:
            s3.put_bytes(s3.S3Url("private-ca", "x"), b"x")
        assert classify(refused.value) == ExitCode.USER_ERROR  # not retried as the infrastructure's
        if crtupload.available():
            with pytest.raises(StorageError, match="writing s3://private-ca/x: the certificate .*CERTIFICATE_VERIFY_FAILED"
                                                   ".*spec.s3.caBundle \\(DDP_S3_CA_BUNDLE\\)") as crt_refused:
                s3.put_large(s3.S3Url("private-ca", "x"), b"x")
            assert classify(crt_refused.value) == ExitCode.USER_ERROR
        monkeypatch.setenv(envnames.S3_CA_BUNDLE, str(tls[2]))
        s3.reset_clients()
        s3.client().create_bucket(Bucket="private-ca")
        url = s3.S3Url("private-ca", "runs/ns/job/results/model.pt")
        s3.upload_fileobj(io.BytesIO(b"weights" * 1000), url)
        large = s3.S3Url("private-ca", "runs/ns/job/checkpoints/step-000000000001/state.pt")
        s3.put_large(large, b"weights" * 1000)
        assert s3.get_bytes(large) == b"weights" * 1000
        access = S3Access(endpoint=endpoint, access_key_id=demo.ACCESS_KEY, secret_access_key=demo.SECRET_KEY,
                          ca_bundle=str(tls[2]))
        assert ResultsPrefix(access, "s3://private-ca/runs", "ns", "job").get("results/model.pt") == b"weights" * 1000
    monkeypatch.setenv(envnames.S3_ENDPOINT, s3_env[envnames.S3_ENDPOINT])
    monkeypatch.delenv(envnames.S3_CA_BUNDLE)
    s3.reset_clients()


@pytest.mark.skipif(not crtupload.available(), reason="awscrt is not installed")
def test_large_uploads_go_through_the_crt_with_the_same_options(strict: StrictStore, bucket: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint's upload (put_large) goes in parallel parts through the AWS CRT, which sends no
    checksum the store refuses; told to send boto3's defaults it is refused there as boto3 is, in words
    that name the object; DDP_S3_CRT=0 sends it through boto3."""
    blob = os.urandom(11 * MB)
    url = s3.S3Url(bucket, "run/checkpoints/step-1/state.pt")
    s3.put_large(url, blob, part_size=5 * MB)
    assert os.getpid() in crtupload._uploaders
    with open_readahead(url) as reader:
        assert reader.read() == blob
    parts = [path for method, path in strict.paths if method == "PUT" and "partNumber=" in path]
    assert len(parts) == 3 and strict.refused == [], (strict.paths, strict.refused)

    monkeypatch.setenv(envnames.S3_CHECKSUMS, "when_supported")
    s3.reset_clients()
    with pytest.raises(TrainerError, match=f"writing s3://{bucket}/run/refused.pt: .*InvalidArgument"):
        s3.put_large(s3.S3Url(bucket, "run/refused.pt"), blob, part_size=5 * MB)
    assert strict.refused

    monkeypatch.setenv(envnames.S3_CHECKSUMS, "when_required")
    monkeypatch.setenv(envnames.S3_CRT, "0")
    s3.reset_clients()
    s3.put_large(s3.S3Url(bucket, "run/boto3.pt"), blob, part_size=5 * MB)
    assert s3.get_bytes(s3.S3Url(bucket, "run/boto3.pt")) == blob and os.getpid() not in crtupload._uploaders


@pytest.mark.skipif(not crtupload.available(), reason="awscrt is not installed")
def test_a_written_upload_streams_and_stops_on_either_side_s_failure(strict: StrictStore, bucket: str) -> None:
    """put_written (a checkpoint's torch.save) sends parts while the writer writes, through the strict
    store; a writer that raises leaves no object; an upload that fails stops the writer with its error."""
    chunks = [os.urandom(MB) for _ in range(23)]
    url = s3.S3Url(bucket, "run/written.pt")
    s3.put_written(url, lambda file: [file.write(chunk) for chunk in chunks], part_size=5 * MB)
    assert s3.get_bytes(url) == b"".join(chunks) and strict.refused == []
    assert len([path for method, path in strict.paths if method == "PUT" and "partNumber=" in path]) == 5

    def fails_half_way(file: IO[bytes]) -> None:
        file.write(chunks[0] * 12)
        raise ValueError("cannot pickle this")

    with pytest.raises(ValueError, match="cannot pickle"):
        s3.put_written(s3.S3Url(bucket, "run/torn.pt"), fails_half_way, part_size=5 * MB)
    with pytest.raises(ObjectNotFoundError):
        s3.head(s3.S3Url(bucket, "run/torn.pt"))

    written: list[int] = []

    def endless(file: IO[bytes]) -> None:
        for chunk in chunks * 100:  # far more than the pipe holds: it must be stopped, not left waiting
            written.append(file.write(chunk))

    with pytest.raises(ObjectNotFoundError, match="bucket 'no-such-bucket' does not exist"):
        s3.put_written(s3.S3Url("no-such-bucket", "x.pt"), endless, part_size=5 * MB)
    assert len(written) < len(chunks) * 100
