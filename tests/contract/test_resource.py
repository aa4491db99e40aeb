"""A DDPJob's metadata and status read through typed views (ddp_contract.resource)."""

from __future__ import annotations

import pytest

from ddp_contract.resource import JobRef, JobStatus, job_key


def test_a_job_is_named_by_its_metadata() -> None:
    job = {"metadata": {"namespace": "team", "name": "mnist", "uid": "u-1"}}
    assert JobRef.of(job) == JobRef("team", "mnist", "u-1") and job_key(job) == ("team", "mnist")
    assert JobRef.of({}) == JobRef("", "", "")


def test_the_status_fields_read_as_typed_values() -> None:
    status = JobStatus.of({"phase": "Running", "attempt": 3, "recreatedAttempt": 1, "rendezvous": {"attempt": 3},
                           "members": [2, 0], "lastCheckpoint": {"uri": "s3://b/c", "step": 40},
                           "checkpointRequested": {"since": "2026-01-01T00:00:00Z"}, "restarts": 2,
                           "failedRank": {"rank": 1}})
    assert (status.phase, status.attempt, status.recreated_attempt, status.formed_attempt) == ("Running", 3, 1, 3)
    assert status.gang_formed and status.members == (2, 0) and status.restarts == 2
    assert (status.checkpoint_uri, status.checkpoint_step) == ("s3://b/c", 40)
    assert status.checkpoint_requested_since == "2026-01-01T00:00:00Z" and status.failed_rank == {"rank": 1}


@pytest.mark.parametrize("raw", [None, {}, {"attempt": None, "rendezvous": "x", "members": [1, 1], "phase": "",
                                           "lastCheckpoint": {"uri": 5, "step": True}, "restarts": -1,
                                           "recreatedAttempt": "2", "failedRank": "rank 1"}])
def test_a_missing_or_malformed_field_reads_as_its_default(raw: dict | None) -> None:
    status = JobStatus.of(raw)
    assert (status.phase, status.attempt, status.recreated_attempt, status.formed_attempt) == (None, 0, None, None)
    assert (status.members, status.checkpoint_uri, status.checkpoint_step, status.restarts) == (None, None, None, 0)
    assert status.failed_rank is None and status.checkpoint_requested_since is None


def test_the_gang_formed_only_once_rank_0_recorded_the_current_attempt() -> None:
    assert not JobStatus.of({"attempt": 2, "rendezvous": {"attempt": 1}}).gang_formed
    assert not JobStatus.of({"attempt": 0}).gang_formed
    assert JobStatus.of({"attempt": 0, "rendezvous": {"attempt": 0}}).gang_formed
