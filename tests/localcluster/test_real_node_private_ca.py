"""A DDPJob whose S3 store serves https with a certificate of a private CA, in trainer-image containers on
the local cluster's real node: with spec.s3.caBundle (a ConfigMap) the ranks checkpoint, log metrics and
write results through it; without it the job fails at once saying the store's certificate is not trusted
and which field trusts it. Select with `pytest -m node`."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from kubernetes import client

import demo
import s3server
from ddp_contract import layout
from ddp_contract.jobstatus import STATUS_RESTARTS
from ddp_operator import constants as c
from kube import Jobs
from realnode import WORKLOADS_TEMPLATE, create_job, node_address, trainer_image, workloads_and_credentials

pytestmark = [pytest.mark.node, pytest.mark.images, pytest.mark.timeout(600)]

BUCKET = "ddp-private-ca"


@pytest.fixture(scope="module")
def private_ca_store(real_node: client.V1Node, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """SeaweedFS serving https on the node's bridge address with a certificate of a CA of its own:
    (its endpoint, the CA's certificate)."""
    host = node_address(real_node)
    certificate, key, ca = s3server.make_certificate(tmp_path_factory.mktemp("private-ca"), host)
    with s3server.seaweedfs(demo.ACCESS_KEY, demo.SECRET_KEY, host=host, tls=(certificate, key, ca)) as endpoint:
        store(endpoint, ca).create_bucket(Bucket=BUCKET)
        yield endpoint, ca


def store(endpoint: str, ca: Path):
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=demo.ACCESS_KEY,
                        aws_secret_access_key=demo.SECRET_KEY, region_name="us-east-1", verify=str(ca))


def keys(endpoint: str, ca: Path, prefix: str) -> list[str]:
    listed = store(endpoint, ca).list_objects_v2(Bucket=BUCKET, Prefix=prefix)
    return [item["Key"] for item in listed.get("Contents", [])]


def job_on(jobs: Jobs, name: str, endpoint: str, **s3: object) -> None:
    """ddp_workloads.train (2 ranks, a checkpoint every 3 steps, results and metrics) against the store."""
    settings = {"WL_BATCH": "4", "WL_EPOCHS": "2", "WL_CKPT_EVERY": "3", "OMP_NUM_THREADS": "1"}
    create_job(jobs, name, image=trainer_image(), entrypoint="ddp_workloads:train", backoffLimit=0,
               env=[{"name": k, "value": v} for k, v in settings.items()], template=WORKLOADS_TEMPLATE,
               resources={"limits": {"memory": "1536Mi"}},
               s3={"endpoint": endpoint, "region": "us-east-1", "credentialsSecret": "s3-credentials",
                   "results": f"s3://{BUCKET}/results", **s3})


@pytest.fixture
def ca_and_credentials(jobs: Jobs, private_ca_store: tuple[str, Path]) -> None:
    """The CA as the ConfigMap `s3-ca` (key ca.crt), the S3 credentials and the ranks' code."""
    _, ca = private_ca_store
    jobs.core.create_namespaced_config_map(jobs.namespace, {"metadata": {"name": "s3-ca"}, "data": {"ca.crt": ca.read_text()}})
    workloads_and_credentials(jobs)


def test_a_job_trusts_its_stores_private_ca_through_ca_bundle_and_says_so_without_it(
        jobs: Jobs, images_on_the_node: None, private_ca_store: tuple[str, Path], ca_and_credentials: None) -> None:
    endpoint, ca = private_ca_store
    job_on(jobs, "trusted", endpoint, caBundle={"configMap": "s3-ca"})
    job_on(jobs, "untrusted", endpoint)

    untrusted = jobs.wait_phase("untrusted", c.PHASE_FAILED, timeout=240)
    said = json.dumps(untrusted)
    assert "is not trusted" in said and "spec.s3.caBundle" in said, said

    trusted = jobs.wait_phase("trusted", c.PHASE_SUCCEEDED, timeout=300)
    prefix = f"results/{jobs.namespace}/trusted/"
    written = keys(endpoint, ca, prefix)
    assert f"{prefix}results/params.pt" in written and f"{prefix}results/final.txt" in written, written
    assert any(k.startswith(f"{prefix}{layout.CHECKPOINTS}/") and k.endswith("/MANIFEST.json") for k in written), written
    assert any(k.startswith(f"{prefix}{layout.METRICS}") for k in written), written
    assert trusted[STATUS_RESTARTS] == 0, trusted
