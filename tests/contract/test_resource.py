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


def test_the_times_conditions_counters_and_reports_a_pass_decides_on() -> None:
    status = JobStatus.of({"reason": "RankFailed", "message": "rank 1 exited 1", "startTime": "2026-01-01T00:00:00Z",
                           "completionTime": "2026-01-01T01:00:00Z", "attemptTime": "2026-01-01T00:30:00Z",
                           "conditions": [{"type": "Running", "status": "False"}, {"type": "RanksBlocked", "status": "True"}],
                           "programRestarts": 2, "rendezvous": {"attempt": 0}, "processFailures": {"1": {"exitCode": 1}}})
    assert (status.reason, status.message) == ("RankFailed", "rank 1 exited 1")
    assert (status.start_time, status.completion_time, status.attempt_time) == (
        "2026-01-01T00:00:00Z", "2026-01-01T01:00:00Z", "2026-01-01T00:30:00Z")
    assert status.condition("RanksBlocked") == {"type": "RanksBlocked", "status": "True"}
    assert status.condition("Restarting") is None
    assert status.count("programRestarts") == 2 and status.count("infrastructureRestarts") == 0
    assert status.gang_reported and status.process_failures == {"1": {"exitCode": 1}}
    empty = JobStatus.of({"reason": 3, "startTime": 5, "conditions": "Running", "programRestarts": "2",
                          "processFailures": [1]})
    assert (empty.reason, empty.message, empty.start_time, empty.condition("Running")) == ("", "", None, None)
    assert empty.count("programRestarts") == 0 and not empty.gang_reported and empty.process_failures is None
