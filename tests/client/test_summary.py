"""The text of `kubectl ddp status` and of wait()'s progress line and outcome."""

from __future__ import annotations

from typing import Any

from ddp_client.summary import outcome_text, progress_line, ranks_text, spares_text, status_text, world_size_text
from ddp_contract import labels


def pod(rank: int, phase: str, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": f"j-{rank}", "labels": {labels.LABEL_RANK: str(rank)}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "status": {"phase": phase}}


FAILED = {
    "phase": "Failed", "reason": "BackoffLimitExceeded", "message": "rank 1 failed 2 times", "attempt": 1,
    "restarts": 1, "programRestarts": 1,
    "progress": {"epoch": 1, "step": 40, "loss": 0.123456, "samplesPerSecond": 812.4},
    "lastCheckpoint": {"step": 30, "uri": "s3://b/r/ns/j/checkpoints/step-000000000030", "time": "2026-01-01T00:00:00Z"},
    "failedRank": {"rank": 1, "pod": "j-1", "node": "gpu-3", "exitCode": 1, "reason": "Error", "kind": "Program",
                   "attempt": 1, "step": 41, "message": "Traceback ...\nValueError: boom"},
}


def test_ranks_are_written_as_runs() -> None:
    assert ranks_text([5, 0, 1, 2, 7, 8]) == "0-2, 5, 7-8"


def test_status_of_a_failed_job_names_phase_ranks_progress_checkpoint_and_the_failure() -> None:
    job = {"metadata": {"name": "j", "namespace": "ns"}, "spec": {"worldSize": 3, "gpusPerRank": 0}, "status": FAILED}
    text = status_text(job, [pod(0, "Succeeded"), pod(1, "Failed"), pod(2, "Running", deleting=True)])
    assert "Phase:        Failed (BackoffLimitExceeded)" in text
    assert "Ranks:        Failed 1; Succeeded 0; Terminating 2" in text
    assert "Progress:     epoch 1, step 40, loss 0.1235, 812 samples/s" in text
    assert "Checkpoint:   step 30 at s3://b/r/ns/j/checkpoints/step-000000000030" in text
    assert "failed rank: rank 1 (pod j-1 on node gpu-3): Error (exit code 1, step 41, attempt 1, Program failure)" in text
    assert text.endswith("    ValueError: boom")


def test_a_job_without_pods_or_progress_says_so() -> None:
    text = status_text({"metadata": {"name": "j", "namespace": "ns"}, "spec": {"worldSize": 2}, "status": {}}, [])
    assert "Phase:        Pending" in text and "Ranks:        no pods" in text
    assert "none reported yet" in text and "Checkpoint:   none committed" in text and "Failure" not in text


def test_progress_line_and_outcome() -> None:
    running = {"phase": "Running", "ready": "2/2", "progress": {"epoch": 0, "step": 5, "loss": 1.5}}
    assert progress_line("j", running) == "j: Running, ready 2/2, epoch 0, step 5, loss 1.5"
    assert outcome_text("j", {"phase": "Succeeded", "progress": {"epoch": 1, "step": 9, "loss": 0.5}}) == \
        "j: Succeeded at epoch 1, step 9, loss 0.5"
    failed = outcome_text("j", FAILED)
    assert failed.startswith("j: Failed at epoch 1") and "reason: BackoffLimitExceeded: rank 1 failed 2 times" in failed
    assert "its last output:\n    Traceback ...\n    ValueError: boom" in failed


def test_how_far_the_run_is_and_the_time_left_where_the_code_says_them() -> None:
    running = {"phase": "Running", "progress": {"epoch": 3, "step": 480, "loss": 0.25, "percent": 62.5,
                                                "remainingSeconds": 750, "remaining": "12m30s"}}
    assert progress_line("j", running) == "j: Running, epoch 3, step 480, loss 0.25, 62.5% done, 12m30s left"
    job = {"metadata": {"name": "j", "namespace": "ns"}, "spec": {"worldSize": 2}, "status": running}
    assert "Progress:     epoch 3, step 480, loss 0.25, 62.5% done, 12m30s left" in status_text(job, [])


def test_an_elastic_job_says_how_many_of_its_ranks_the_gang_has() -> None:
    elastic = {"worldSize": 4, "minWorldSize": 2}
    assert world_size_text(elastic, {"worldSize": 2}) == "2 of 4 ranks (minimum 2)"
    assert world_size_text(elastic, {}) == "4 of 4 ranks (minimum 2)"
    assert world_size_text({"worldSize": 4}, {"worldSize": 4}) == "4 ranks"
    assert world_size_text({"worldSize": 4, "minWorldSize": 4}, {}) == "4 ranks"


def test_a_job_with_spare_pods_names_those_waiting_outside_its_gang() -> None:
    spec = {"worldSize": 2, "sparePods": 1, "restartStrategy": "InPlace"}
    pods = [pod(0, "Running"), pod(1, "Pending"), pod(2, "Running")]
    assert spares_text(spec, {"members": [0, 2]}, pods) == "j-1 Pending"
    assert spares_text(spec, {}, pods) == "j-2 Running"
    assert spares_text(spec, {}, pods[:2]) == "none yet"
    assert spares_text({"worldSize": 2}, {}, pods) == ""
    job = {"metadata": {"name": "j", "namespace": "ns"}, "spec": spec, "status": {"members": [0, 2]}}
    assert "Spare pods:   j-1 Pending" in status_text(job, iter(pods))


def test_a_job_that_succeeded_after_restarts_shows_the_last_restart_as_history_not_as_a_failure() -> None:
    status = {"phase": "Succeeded", "reason": "AllRanksSucceeded", "message": "all 2 ranks exited 0", "attempt": 3,
              "restarts": 2, "infrastructureRestarts": 2,
              "failedRank": {"rank": 0, "pod": "chaos-run-0", "reason": "RankMissing", "kind": "Infrastructure",
                             "attempt": 2, "message": "the pod was deleted"}}
    job = {"metadata": {"name": "chaos-run", "namespace": "ns"}, "spec": {"worldSize": 2}, "status": status}
    text = status_text(job, [pod(0, "Succeeded"), pod(1, "Succeeded")])
    assert "Failure" not in text and "failed rank" not in text and "reason: AllRanksSucceeded" not in text
    assert text.endswith("Last restart:\n"
                         "  caused by: rank 0 (pod chaos-run-0): RankMissing (attempt 2, Infrastructure failure)\n"
                         "  its last output:\n"
                         "      the pod was deleted")
    assert "Phase:        Succeeded (AllRanksSucceeded)" in text


def test_a_running_job_shows_what_caused_its_last_restart() -> None:
    status = {"phase": "Running", "attempt": 2, "restarts": 1, "programRestarts": 1, "failedRank": FAILED["failedRank"]}
    job = {"metadata": {"name": "j", "namespace": "ns"}, "spec": {"worldSize": 3}, "status": status}
    text = status_text(job, [pod(0, "Running"), pod(1, "Running"), pod(2, "Running")])
    assert "Last restart:\n  caused by: rank 1 (pod j-1 on node gpu-3): Error (exit code 1, step 41, attempt 1, " \
           "Program failure)" in text
    assert "Failure" not in text


def test_the_folders_a_job_keeps_are_said_with_their_files_and_size() -> None:
    spec = {"worldSize": 2, "keepFolders": ["out", "runs"]}
    kept = {"time": "2026-01-01T00:00:00Z", "folders": [
        {"path": "out", "uri": "s3://b/r/ns/j/kept/out", "files": 12, "bytes": 1_234_000_000},
        {"path": "runs", "uri": "s3://b/r/ns/j/kept/runs", "files": 1, "bytes": 812}]}
    job = {"metadata": {"name": "j", "namespace": "ns"}, "spec": spec, "status": {"phase": "Running", "kept": kept}}
    assert "Kept:         out: 12 files, 1.2 GB; runs: 1 file, 812 B (at 2026-01-01T00:00:00Z)" in status_text(job, [])
    kept["folders"][0].update({"pending": 2, "behindSince": "2025-12-31T23:59:30Z"})
    kept["folders"][1].update({"pending": 1, "behindSince": "2025-12-31T23:58:00Z"})
    assert ("Kept:         out: 12 files, 1.2 GB, behind by 2 files since 2025-12-31T23:59:30Z; "
            "runs: 1 file, 812 B, behind by 1 file since 2025-12-31T23:58:00Z (at 2026-01-01T00:00:00Z)"
            ) in status_text(job, [])
    job["status"] = {"phase": "Running"}
    assert "Kept:         nothing yet" in status_text(job, [])
    assert "Kept:" not in status_text({"metadata": {}, "spec": {"worldSize": 2}, "status": {}}, [])


def test_status_says_where_the_last_restart_resumed_from_and_how_the_pods_keep_snapshots() -> None:
    job = {"metadata": {"name": "j", "namespace": "ns"}, "spec": {"worldSize": 2}, "status": {
        "recovery": {"attempt": 2, "step": 1200, "source": "Memory", "pods": ["j-1"], "reachedStep": 1201,
                     "stepsLost": 1},
        "memorySnapshots": {"every": "every step", "copies": 2, "bytes": 1_200_000_000,
                            "directory": "/dev/shm/ddp-snapshots"}}}
    text = status_text(job, [])
    assert "Recovery:     attempt 2 resumed at step 1200 from the memory of pod j-1, 1 step lost" in text
    assert "Snapshots:    every step in pod memory (/dev/shm/ddp-snapshots), 2 copies of 1.2 GB a pod" in text
    job["status"] = {"memorySnapshots": {"off": "memory snapshots are off: 2 copies ..."}}
    text = status_text(job, [])
    assert "Snapshots:    memory snapshots are off: 2 copies ..." in text and "Recovery:" not in text


def test_a_checkpoint_waiting_for_s3_is_said_under_the_last_one_committed() -> None:
    job = {"metadata": {"name": "j", "namespace": "ns"}, "spec": {"worldSize": 2}, "status": {
        "lastCheckpoint": FAILED["lastCheckpoint"],
        "checkpointsBehind": {"since": "2026-01-01T00:01:00Z", "step": 50, "error": "S3 endpoint unreachable"}}}
    lines = status_text(job, []).splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("Checkpoint:"))
    assert lines[at + 1] == ("              step 50 waits for S3, unreachable since 2026-01-01T00:01:00Z "
                             "(S3 endpoint unreachable)")
    job["status"]["checkpointsBehind"] = None  # cleared once one is committed
    assert "waits for S3" not in status_text(job, [])
