"""S3 settings for the client: the job's, the Secret's, the environment's and flags."""

from __future__ import annotations

import base64

import pytest

from ddp_client.store import S3Access, StoreError, ca_bundle_file, job_access, split_uri
from ddp_contract import layout
from ddp_contract.jobspec import S3Spec


def test_the_jobs_endpoint_and_its_secrets_keys_unless_flags_say_otherwise() -> None:
    secret = {"data": {k: base64.b64encode(v.encode()).decode()
                       for k, v in {"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "key"}.items()}}
    access = job_access(S3Spec(endpoint="http://s3:9000", region="eu-west-1"), secret, "creds")
    assert access == S3Access("http://s3:9000", "eu-west-1", "id", "key")
    flags = S3Access(endpoint="http://other:9000")
    assert flags.over(access) == S3Access("http://other:9000", "eu-west-1", "id", "key")
    with pytest.raises(StoreError, match="Secret creds has no key 'AWS_SECRET_ACCESS_KEY'"):
        job_access(S3Spec(), {"data": {"AWS_ACCESS_KEY_ID": "aWQ="}}, "creds")


def test_environment_settings() -> None:
    env = {"DDP_S3_ENDPOINT": "http://e", "AWS_REGION": "r", "AWS_ACCESS_KEY_ID": "i", "AWS_SECRET_ACCESS_KEY": "k"}
    assert S3Access.from_env(env) == S3Access("http://e", "r", "i", "k")


def test_the_jobs_checksums_addressing_and_ca_bundle_and_the_environment_s(tmp_path) -> None:
    spec_s3 = S3Spec.from_spec({"endpoint": "http://s3:9000", "checksums": "WhenSupported", "addressingStyle": "Virtual",
                                "caBundle": {"configMap": "corp-ca"}})
    access = job_access(spec_s3, None, None, ca_bundle="/tmp/ca.pem")
    options = access.options()
    assert (options.checksum_mode, options.addressing_style, options.ca_bundle) == ("when_supported", "virtual",
                                                                                   "/tmp/ca.pem")
    assert job_access(S3Spec(endpoint="http://s3:9000"), None, None).options().checksum_mode == "when_required"
    env = S3Access.from_env({"DDP_S3_CHECKSUMS": "when_required", "DDP_S3_CA_BUNDLE": "/etc/mine.pem"})
    assert env.over(access).options().checksum_mode == "when_required" and env.over(access).ca_bundle == "/etc/mine.pem"
    with pytest.raises(StoreError, match="DDP_S3_ADDRESSING_STYLE='bucket' must be one of"):
        S3Access.from_env({"DDP_S3_ADDRESSING_STYLE": "bucket"})


def test_a_config_map_s_ca_bundle_is_written_once_by_its_content(tmp_path) -> None:
    config_map = {"metadata": {"name": "corp-ca", "namespace": "ns"}, "data": {"ca.crt": "PEM one\n"}}
    first = ca_bundle_file(config_map, "ca.crt", tmp_path)
    assert open(first).read() == "PEM one\n" and ca_bundle_file(config_map, "ca.crt", tmp_path) == first
    other = ca_bundle_file({**config_map, "data": {"ca.crt": "PEM two\n"}}, "ca.crt", tmp_path)
    assert other != first and sorted(p.name for p in tmp_path.iterdir()) == sorted([first[-20:], other[-20:]])
    with pytest.raises(StoreError, match="ConfigMap ns/corp-ca \\(spec.s3.caBundle\\) has no key 'bundle.pem'"):
        ca_bundle_file(config_map, "bundle.pem", tmp_path)


def test_uris_and_log_keys() -> None:
    assert split_uri("s3://bucket/a/b/") == ("bucket", "a/b")
    with pytest.raises(StoreError, match="not an s3://bucket/prefix URI"):
        split_uri("bucket/a")
    key = layout.log_part(2, 13, 1)
    assert key == "logs/attempt-2/rank-13/part-00001.log"
    assert layout.parse_log_part(key) == layout.LogPart(2, 13, 1)
    assert layout.parse_log_part("logs/attempt-2/rank-13.txt") is None
    assert layout.parse_log_part("x/attempt-1/rank-1/part-00000.log") is None
    assert layout.job_key("runs/", "ns", "job") == "runs/ns/job" and layout.job_key("", "ns", "job") == "ns/job"
