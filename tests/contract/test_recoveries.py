"""status.recovery: the record rank 0 writes and the words the client says of it."""

from __future__ import annotations

from ddp_contract import recoveries


def test_a_recovery_from_memory_names_the_pods_and_the_steps_lost() -> None:
    found = recoveries.record(attempt=3, step=1200, source=recoveries.SOURCE_MEMORY, pods=["job-1"], reached=1201,
                              memory=True, now=0.0)
    assert found == {"attempt": 3, "step": 1200, "source": "Memory", "snapshots": True, "pods": ["job-1"],
                     "reachedStep": 1201, "stepsLost": 1, "time": "1970-01-01T00:00:00Z"}
    assert recoveries.text(found) == "attempt 3 resumed at step 1200 from the memory of pod job-1, 1 step lost"
    many = recoveries.record(attempt=1, step=5, source=recoveries.SOURCE_MEMORY, pods=[f"p-{i}" for i in range(5)],
                             reached=5)
    assert recoveries.text(many) == "attempt 1 resumed at step 5 from the memory of pods p-0, p-1, p-2 and 2 more, 0 steps lost"


def test_a_recovery_from_s3_says_when_no_pod_held_newer_state_and_leaves_unknown_losses_unsaid() -> None:
    s3 = recoveries.record(attempt=2, step=100, source=recoveries.SOURCE_S3, checkpoint="s3://b/c/step-100",
                           memory=True, reached=130)
    assert recoveries.text(s3) == ("attempt 2 resumed at step 100 from the checkpoint in S3 (no pod of the gang "
                                   "held a newer state in memory), 30 steps lost")
    plain = recoveries.record(attempt=2, step=100, source=recoveries.SOURCE_S3, checkpoint="s3://b/c/step-100")
    assert "stepsLost" not in plain and recoveries.text(plain) == "attempt 2 resumed at step 100 from the checkpoint in S3"
    assert recoveries.text(recoveries.record(attempt=1, step=0, source=recoveries.SOURCE_NONE)) == \
        "attempt 1 started again from step 0 (no checkpoint yet)"


def test_every_field_a_record_may_have_is_named_for_the_status_patch_that_clears_the_rest() -> None:
    full = recoveries.record(attempt=3, step=1, source=recoveries.SOURCE_MEMORY, pods=["p"], checkpoint="s3://b/c",
                             reached=2)
    assert set(full) == set(recoveries.FIELDS)
