"""Job.results against a real S3 server (SeaweedFS on loopback)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ddp_client.job import Job
from ddp_client.store import S3Access, StoreError
from kube import REPO

sys.path.insert(0, str(REPO / "localcluster"))
import demo  # its S3 server and client

BUCKET = "results-bucket"
RESULTS = "runs/ns/j/results"  # the job's results/ under s3://BUCKET/runs


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with demo.s3_server(0, buckets=(BUCKET,)) as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def verbatim_keys_s3() -> Iterator[str]:
    """moto: AWS keeps a key such as 'a/../../b' or '/abs' verbatim, and so does moto, while SeaweedFS
    (a filesystem underneath) folds it into a path; the keys a hostile writer could make need moto."""
    with demo.s3_server(0, buckets=(BUCKET,), kind="moto") as endpoint:
        yield endpoint


class StoredJob(Job):
    """A job whose spec is given (no API to ask) and whose results lie in the test's S3 server."""

    def __init__(self, endpoint: str) -> None:
        from kubernetes import client

        access = S3Access(endpoint=endpoint, access_key_id=demo.ACCESS_KEY, secret_access_key=demo.SECRET_KEY)
        super().__init__("j", "ns", client.ApiClient(), s3_access=access)

    def get(self) -> dict[str, Any]:
        return {"spec": {"s3": {"results": f"s3://{BUCKET}/runs"}}}


def test_a_result_key_that_would_land_outside_the_folder_is_refused_before_anything_is_written(
        verbatim_keys_s3: str, tmp_path: Path) -> None:
    s3, job, out = demo.s3_client(verbatim_keys_s3), StoredJob(verbatim_keys_s3), tmp_path / "out"
    s3.put_object(Bucket=BUCKET, Key=f"{RESULTS}/eval/accuracy.json", Body=b"{}")
    assert job.results(download=out) == [out / "eval" / "accuracy.json"]
    # Written straight to S3 by another program: each would land on tmp_path/escaped, outside `out`.
    for bad in (f"/{tmp_path}/escaped", "../escaped", "eval/../../escaped"):
        s3.put_object(Bucket=BUCKET, Key=f"{RESULTS}/{bad}", Body=b"x")
        with pytest.raises(StoreError) as refused:
            job.results(download=tmp_path / "again")
        assert str(refused.value) == (
            f"result s3://{BUCKET}/{RESULTS}/{bad} is not named as results are (a relative path without empty, "
            f"'.' or '..' parts): it could be written outside {tmp_path / 'again'}, so nothing was downloaded")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
        s3.delete_object(Bucket=BUCKET, Key=f"{RESULTS}/{bad}")


def test_the_kept_folders_are_listed_and_downloaded_folder_by_folder(s3_endpoint: str, tmp_path: Path) -> None:
    s3, job = demo.s3_client(s3_endpoint), StoredJob(s3_endpoint)
    kept = "runs/ns/j/kept"
    s3.put_object(Bucket=BUCKET, Key=f"{kept}/out/checkpoint-2/trainer_state.json", Body=b"{}")
    s3.put_object(Bucket=BUCKET, Key=f"{kept}/workspace/runs/events.out.tfevents.1.h", Body=b"event")
    assert [(f.path, f.size) for f in job.kept()] == [("out/checkpoint-2/trainer_state.json", 2),
                                                       ("workspace/runs/events.out.tfevents.1.h", 5)]
    out = tmp_path / "run" / "kept"
    assert job.kept(download=out) == [out / "out" / "checkpoint-2" / "trainer_state.json",
                                      out / "workspace" / "runs" / "events.out.tfevents.1.h"]
    assert (out / "workspace" / "runs" / "events.out.tfevents.1.h").read_bytes() == b"event"
