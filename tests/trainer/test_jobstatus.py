"""Rank 0's writes to the DDPJob's status: the records, and never an error out of them. Against the API
server: tests/operator/cluster/test_progress.py."""

from __future__ import annotations

import logging

import pytest

from ddp_trainer import jobstatus


def test_the_records_say_when_in_rfc3339() -> None:
    assert jobstatus.last_checkpoint(20, "s3://b/j/checkpoints/step-000000000020", now=1.0) == {
        "step": 20, "uri": "s3://b/j/checkpoints/step-000000000020", "time": "1970-01-01T00:00:01Z"}
    assert jobstatus.rendezvous(2, 1.23456, 0.0008, now=0.0) == {
        "attempt": 2, "formedSeconds": 1.235, "allReduceMillis": 0.8, "time": "1970-01-01T00:00:00Z"}


def test_outside_the_operator_there_is_no_sink_and_nothing_is_written(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DDP_JOB_NAME", "KUBERNETES_SERVICE_HOST", "KUBECONFIG"):
        monkeypatch.delenv(name, raising=False)
    assert jobstatus.in_cluster_sink() is None
    monkeypatch.setenv("DDP_JOB_NAME", "j")  # a job's name, but no API server to write to
    assert jobstatus.in_cluster_sink() is None
    assert jobstatus.record({"rendezvous": {}}) is False


class _Refusing:
    def __init__(self) -> None:
        self.calls = 0

    def patch_namespaced_custom_object_status(self, *args: object, **kwargs: object) -> None:
        self.calls += 1
        raise RuntimeError("403 Forbidden")


def test_a_failed_write_is_false_and_warned_of_once_a_while(caplog: pytest.LogCaptureFixture) -> None:
    sink = jobstatus.JobStatusSink("ns", "j", api_client=object(), quiet_s=3600)
    sink.api = _Refusing()
    with caplog.at_level(logging.WARNING):
        assert sink.patch({"progress": {"step": 1}}) is False
        sink({"step": 2})
    assert sink.api.calls == 2
    assert [r.getMessage() for r in caplog.records] == ["could not write progress to DDPJob ns/j: 403 Forbidden"]
