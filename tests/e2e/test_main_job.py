"""The main job end to end: operator, local pod runner, trainer runtime, S3, a killed rank."""

from __future__ import annotations

import json
import os
import signal
import sys

from ddp_contract import labels, layout
from ddp_operator import constants as c
from e2ehelp import BUCKET, start_job, workload_job
from kube import REPO, wait_until
from procs import rank_pid

sys.path.insert(0, str(REPO / "localcluster"))
import demo


def s3_keys(endpoint: str, prefix: str) -> list[str]:
    listing = demo.s3_client(endpoint).list_objects_v2(Bucket=BUCKET, Prefix=prefix)
    return [item["Key"] for item in listing.get("Contents", [])]


def first_steps(endpoint: str, prefix: str) -> list[int]:
    """The first step logged by each metrics file (one file per rank process)."""
    s3 = demo.s3_client(endpoint)
    steps = []
    for key in s3_keys(endpoint, prefix):
        if "/metrics/" in key:
            body = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read().decode()
            steps.append(json.loads(body.splitlines()[0])["step"])
    return sorted(steps)


def test_main_job_trains_reports_progress_and_leaves_results_in_s3(jobs, s3_endpoint, podrunner) -> None:
    start_job(jobs, s3_endpoint, "shapes", ["--epochs", "2", "--batch-size", "16", "--workers", "0",
                                            "--checkpoint-every", "5"])
    status = jobs.wait_phase("shapes", c.PHASE_SUCCEEDED, timeout=300)
    assert status["restarts"] == 0
    steps_per_epoch = 48 * 3 // (16 * 2)  # images / (batch size * ranks), rounded down
    assert status["progress"]["epoch"] == 1 and status["progress"]["step"] >= 2 * steps_per_epoch
    assert status["progress"]["loss"] is not None
    gang = status["rendezvous"]
    assert gang["attempt"] == 0 and 0 < gang["formedSeconds"] < 300 and gang["allReduceMillis"] > 0, gang

    prefix = f"results/{jobs.namespace}/shapes/"
    keys = s3_keys(s3_endpoint, prefix)
    assert any(k.endswith("results/model.pt") for k in keys), keys
    assert sum(k.endswith("MANIFEST.json") for k in keys) >= 1
    assert sum("/metrics/" in k for k in keys) == 2, "one metrics file per rank"


def test_killed_rank_restarts_the_gang_which_resumes_from_the_last_checkpoint(jobs, s3_endpoint, podrunner) -> None:
    start_job(jobs, s3_endpoint, "resilient", ["--epochs", "8", "--batch-size", "8", "--workers", "0",
                                               "--checkpoint-every", "5"])
    prefix = f"results/{jobs.namespace}/resilient/"
    wait_until(lambda: any(k.endswith("MANIFEST.json") for k in s3_keys(s3_endpoint, prefix)), 240,
               "a first committed checkpoint")
    pid = wait_until(lambda: rank_pid(jobs.namespace, "resilient", 1), 30, "rank 1's process")
    os.kill(pid, signal.SIGKILL)

    status = jobs.wait_phase("resilient", c.PHASE_SUCCEEDED, timeout=400)
    assert status["restarts"] == 1 and status["infrastructureRestarts"] == 1  # SIGKILL from outside
    assert status["failedRank"]["rank"] == 1 and status["failedRank"]["exitCode"] == 137
    last = status["lastCheckpoint"]
    assert last["uri"] == f"s3://{BUCKET}/{prefix}{layout.CHECKPOINTS}/step-{last['step']:012d}", last
    # The second gang started after a checkpoint, not from step 1: it resumed.
    # (The killed gang's own metrics may be lost with it; the second gang's are complete.)
    resumed = [step for step in first_steps(s3_endpoint, prefix) if step > 1]
    assert len(resumed) == 2 and resumed[0] == resumed[1] and (resumed[0] - 1) % 5 == 0, resumed
    pods = jobs.pods("resilient")
    assert {p.metadata.labels[labels.LABEL_ATTEMPT] for p in pods} == {"1"}


def test_a_hung_rank_dumps_every_ranks_stacks_and_restarts_the_gang_on_the_infrastructure_budget(
        jobs, s3_endpoint, podrunner) -> None:
    start_job(jobs, s3_endpoint, "stuck", [], workload_job(s3_endpoint, "stuck", "ddp_workloads:hang",
                                                           hangTimeoutSeconds=3, backoffLimit=0,
                                                           infrastructureBackoffLimit=1))
    status = jobs.wait_phase("stuck", c.PHASE_FAILED, timeout=240)
    assert status["reason"] == c.REASON_BACKOFF_LIMIT and status["infrastructureRestarts"] == 1, status
    failed = status["failedRank"]
    assert failed["reason"] == c.REASON_HUNG and failed["kind"] == c.KIND_INFRASTRUCTURE and failed["attempt"] == 1
    assert "since step 3" in status["message"] or "since step 4" in status["message"], status["message"]
    prefix = f"results/{jobs.namespace}/stuck/{layout.HANGS}/"
    dumps = sorted(k.removeprefix(prefix) for k in s3_keys(s3_endpoint, prefix))
    assert dumps == [f"attempt-{a}/rank-{r}.txt" for a in (0, 1) for r in (0, 1)], dumps
    assert f"stacks in s3://{BUCKET}/{prefix}attempt-1/rank-" in status["message"]
    hung = [e for e in jobs.events("stuck") if e.reason == c.REASON_HUNG]
    assert hung and hung[0].type == "Warning" and f"{prefix}attempt-0/" in hung[0].message


def test_the_same_bug_at_the_same_step_twice_fails_the_job_as_deterministic(jobs, s3_endpoint, podrunner) -> None:
    start_job(jobs, s3_endpoint, "buggy", [], workload_job(s3_endpoint, "buggy", "ddp_workloads:fail_at_step",
                                                           backoffLimit=5))
    status = jobs.wait_phase("buggy", c.PHASE_FAILED, timeout=180)
    assert status["reason"] == c.REASON_DETERMINISTIC and status["restarts"] == 1, status
    assert "rank 1" in status["message"] and "at step 3: ValueError: a bug that fires at step 3" in status["message"]
    assert status["failedRank"]["step"] == 3 and "Traceback" in status["failedRank"]["message"]
