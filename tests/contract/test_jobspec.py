"""The spec's types, shared by the operator (which checks a spec into them) and the client (which
builds a spec from them)."""

from __future__ import annotations

from typing import Any

import pytest

import ddp_client
from ddp_client.jobspec import build_job
from ddp_contract.jobspec import CABundle, S3Spec
from ddp_operator.spec import parse_spec

FULL_S3: dict[str, Any] = {"endpoint": "https://s3.example.com", "region": "eu-west-1",
                           "credentialsSecret": "s3-credentials", "dataset": "s3://data/train",
                           "results": "s3://runs/results", "checksums": "WhenRequired", "addressingStyle": "Virtual",
                           "caBundle": {"configMap": "corp-ca", "key": "bundle.pem"}}


@pytest.mark.parametrize("s3", [FULL_S3, {"results": "s3://runs/results"}, {"endpoint": "http://minio:9000",
                                                                           "caBundle": {"configMap": "ca"}}],
                         ids=["every-field", "results-only", "default-key"])
def test_what_the_client_reads_of_spec_s3_is_what_the_operator_makes_of_it(s3: dict[str, Any]) -> None:
    checked = parse_spec({"worldSize": 1, "image": "trainer:1", "entrypoint": "train:main", "s3": s3}).s3
    assert S3Spec.from_spec(s3) == checked


def test_spec_s3_written_back_is_what_was_read_with_defaults_left_out() -> None:
    assert S3Spec.from_spec(FULL_S3).to_spec() == FULL_S3
    assert S3Spec.from_spec({"results": "s3://r", "checksums": "Auto", "region": ""}).to_spec() == {"results": "s3://r"}
    assert S3Spec.from_spec(None) == S3Spec() and S3Spec().to_spec() == {}
    assert S3Spec.from_spec({"caBundle": {"configMap": "ca"}}).ca_bundle == CABundle("ca", "ca.crt")


def test_the_client_s_s3_is_the_spec_s_type_and_goes_into_the_job_it_builds() -> None:
    assert ddp_client.S3 is S3Spec
    job = build_job("train:main", name="j", image="trainer:1",
                    s3=ddp_client.S3(results="s3://runs", credentials_secret="creds", addressing_style="Path"))
    assert job["spec"]["s3"] == {"results": "s3://runs", "credentialsSecret": "creds", "addressingStyle": "Path"}
