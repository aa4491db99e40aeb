"""The S3 options every client of ours shares: what they make boto3 send, read off the requests it
would send (a `before-send` hook answers them; nothing leaves the process)."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.config import Config

from ddp_contract import envnames
from ddp_contract.s3options import S3OptionError, S3Options, spec_settings


class Sent:
    """The headers of every request a client sent, each answered 200 with an empty body."""

    def __init__(self) -> None:
        self.headers: dict[str, dict[str, str]] = {}

    def __call__(self, request: Any, event_name: str, **_: Any) -> AWSResponse:
        self.headers[event_name.rsplit(".", 1)[-1]] = {k.lower(): v.decode() if isinstance(v, bytes) else v
                                                       for k, v in request.headers.items()}
        body = b"<DeleteResult></DeleteResult>" if event_name.endswith("DeleteObjects") else b""
        return AWSResponse(request.url, 200, {}, _Raw(body))


class _Raw:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def stream(self, **_: Any) -> Any:
        yield self.body


def requests_of(options: S3Options) -> dict[str, dict[str, str]]:
    client = boto3.session.Session().client(
        "s3", endpoint_url=options.endpoint, region_name="us-east-1", aws_access_key_id="k",
        aws_secret_access_key="s", config=Config(**options.config_kwargs()), **options.client_kwargs())
    sent = Sent()
    client.meta.events.register("before-send.s3", sent)
    options.prepare(client)
    client.put_object(Bucket="b", Key="k", Body=b"hello")
    client.delete_objects(Bucket="b", Delete={"Objects": [{"Key": "k"}]})
    return sent.headers


def checksum_headers(headers: dict[str, str]) -> set[str]:
    return {name for name in headers if name.startswith("x-amz-checksum-") or name == "x-amz-sdk-checksum-algorithm"}


def test_a_store_of_its_own_endpoint_gets_checksums_only_where_required_as_content_md5() -> None:
    sent = requests_of(S3Options(endpoint="http://127.0.0.1:9"))
    assert checksum_headers(sent["PutObject"]) == set() and "content-md5" not in sent["PutObject"]
    assert checksum_headers(sent["DeleteObjects"]) == set()
    body = b'<Delete xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Object><Key>k</Key></Object></Delete>'
    assert sent["DeleteObjects"]["content-md5"] == base64.b64encode(hashlib.md5(body).digest()).decode()


def test_when_supported_keeps_boto3_s_defaults() -> None:
    sent = requests_of(S3Options(endpoint="http://127.0.0.1:9", checksums="when_supported"))
    assert "x-amz-checksum-crc32" in sent["PutObject"]
    assert "x-amz-checksum-crc32" in sent["DeleteObjects"] and "content-md5" not in sent["DeleteObjects"]


def test_defaults_follow_the_endpoint_and_settings_name_what_is_wrong() -> None:
    assert S3Options().config_kwargs() == {"request_checksum_calculation": "when_supported",
                                           "response_checksum_validation": "when_supported"}
    assert S3Options(endpoint="http://s3:9000").config_kwargs()["s3"] == {"addressing_style": "path"}
    assert S3Options(endpoint="http://s3:9000", addressing_style="virtual").config_kwargs()["s3"] == \
        {"addressing_style": "virtual"}
    assert S3Options(ca_bundle="/etc/ca.pem").client_kwargs() == {"verify": "/etc/ca.pem"}
    assert S3Options.from_env({envnames.S3_CHECKSUMS: " WHEN_SUPPORTED "}, None).checksums == "when_supported"
    with pytest.raises(S3OptionError, match="DDP_S3_CHECKSUMS='md5' must be one of when_required, when_supported"):
        S3Options.from_env({envnames.S3_CHECKSUMS: "md5"}, None)


def test_spec_values_become_settings_and_auto_sets_none() -> None:
    assert spec_settings({"checksums": "Auto", "addressingStyle": "Auto"}) == {}
    assert spec_settings({"checksums": "WhenRequired", "addressingStyle": "Path", "caBundle": {"configMap": "ca"}}) == {
        envnames.S3_CHECKSUMS: "when_required", envnames.S3_ADDRESSING_STYLE: "path",
        envnames.S3_CA_BUNDLE: "/etc/ddp-operator/s3-ca/ca.crt"}
