"""Results and per-rank metrics under the job's prefix, against a real S3 server."""

from __future__ import annotations

import json
import time
import uuid

import pytest
import torch

from ddp_trainer.errors import ConfigError
from ddp_trainer.storage import results, s3
from ddp_trainer.storage.results import DaskResultsHandler, S3ResultsHandler, job_prefix, read_metrics
from linkproxy import LinkProxy
from waiting import wait_until


def test_results_go_under_the_job_prefix(bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDP_RESULTS_URI", f"s3://{bucket}/experiments/")
    monkeypatch.setenv("DDP_JOB_NAME", "resnet")
    monkeypatch.setenv("DDP_JOB_NAMESPACE", "ml")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("DDP_ATTEMPT", "2")
    assert job_prefix() == s3.S3Url(bucket, "experiments/ml/resnet")
    handler = S3ResultsHandler(flush_interval_s=3600)
    url = handler.submit_result("eval/accuracy.json", json.dumps({"top1": 0.5}))
    assert url == s3.S3Url(bucket, "experiments/ml/resnet/results/eval/accuracy.json")
    assert json.loads(s3.get_bytes(url)) == {"top1": 0.5}
    handler.log_metrics(1, 0, torch.tensor(2.5), accuracy=0.25)
    handler.log_metrics(2, 0, 1.5)
    assert read_metrics(job_prefix()) == []  # buffered until flush / interval
    handler.close()
    records = read_metrics(job_prefix())
    assert [(r["step"], r["epoch"], r["loss"], r["rank"], r["attempt"]) for r in records] == [
        (1, 0, 2.5, 3, 2), (2, 0, 1.5, 3, 2)]
    assert records[0]["accuracy"] == 0.25 and abs(records[0]["time"] - time.time()) < 60
    assert handler.metrics_url.key.startswith("experiments/ml/resnet/metrics/rank-00003-")
    for bad in ("../escape", "/etc/passwd", "a//b", "dir/", "./x", ""):
        with pytest.raises(ConfigError, match="must be a relative path"):
            handler.submit_result(bad, b"x")


def test_missing_job_name_is_named(bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDP_RESULTS_URI", f"s3://{bucket}/x")
    monkeypatch.delenv("DDP_JOB_NAME", raising=False)
    with pytest.raises(ConfigError, match="DDP_JOB_NAME is not set"):
        S3ResultsHandler()


def test_metrics_start_a_new_part_once_one_is_full_and_keep_every_line(
        bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long job neither keeps all its metrics in memory nor uploads them again: a full part is left."""
    monkeypatch.setattr(results, "PART_BYTES", 400)
    monkeypatch.setenv("DDP_RESULTS_URI", f"s3://{bucket}/long")
    monkeypatch.setenv("DDP_JOB_NAME", "j")
    monkeypatch.setenv("DDP_JOB_NAMESPACE", "ns")
    handler = S3ResultsHandler(rank=1, flush_interval_s=0)
    for step in range(20):
        handler.log_metrics(step, 0, 1.0 / (step + 1))
    handler.close()
    keys = [key for key, _ in s3.list_objects(job_prefix().join("metrics"))]
    assert len(keys) > 3 and all(key.endswith(".jsonl") for key in keys)
    assert sorted(keys) == [handler.prefix.join("metrics", f"rank-00001-{handler.session}-{part:05d}.jsonl").key
                            for part in range(len(keys))]
    assert len(handler._lines) < 20 and handler._bytes < 400 + 200
    assert [r["step"] for r in read_metrics(job_prefix())] == list(range(20))


def test_dask_pytorch_ddp_s_handler_takes_its_key_and_writes_under_the_job(
        bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDP_RESULTS_URI", f"s3://{bucket}/dask")
    monkeypatch.setenv("DDP_JOB_NAME", "j")
    monkeypatch.setenv("DDP_JOB_NAMESPACE", "ns")
    monkeypatch.setenv("RANK", "0")
    key = uuid.uuid4().hex
    for handler in (DaskResultsHandler(key), DaskResultsHandler(pub_sub_key=key)):
        url = handler.submit_result(path="model.pkl", data=b"weights")
        assert url == s3.S3Url(bucket, "dask/ns/j/results/model.pkl") and s3.get_bytes(url) == b"weights"


def test_metrics_logged_through_an_s3_outage_are_all_written_once_it_answers(
        bucket: str, s3_outage: LinkProxy) -> None:
    handler = S3ResultsHandler(f"s3://{bucket}/job", rank=0, flush_interval_s=0)  # each line flushed
    handler.log_metrics(1, 0, 1.0)
    s3_outage.down()
    for step in range(2, 40):  # training goes on: no line waits for S3 or raises, and none is lost
        handler.log_metrics(step, 0, 1.0 / step)
    wait_until(lambda: s3_outage.refused >= 2, timeout=20, what="the lines tried again through the outage")
    s3_outage.refusing = False
    handler.close()  # waits for the lines S3 did not take yet
    assert [r["step"] for r in read_metrics(s3.S3Url(bucket, "job"))] == list(range(1, 40))
