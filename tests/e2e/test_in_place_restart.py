"""restartStrategy InPlace end to end (operator, pod runner, trainer runtime, S3): a failed rank process
starts again in its own pod, a deleted pod is the only one replaced, and training resumes exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import demo
from ddp_contract import api, labels, layout
from ddp_operator import constants as c
from e2ehelp import BUCKET, recoveries_kept, start_job, workload_job
from kube import Jobs, wait_until
from procs import rank_pid

# 96 samples, 2 ranks, batches of 4: 12 steps an epoch, 36 in all; a checkpoint every 4 steps. One
# thread a rank: the jobs' parameters are compared to the bit, which holds on any CPU because both
# jobs run on this one, summing in the same order whatever torch's default thread count would be.
STEADY = {"WL_BATCH": "4", "WL_EPOCHS": "3", "WL_CKPT_EVERY": "4", "OMP_NUM_THREADS": "1"}


def train_job(endpoint: str, name: str, out: Path, strategy: str = api.RESTART_IN_PLACE, **env: str) -> dict:
    job = workload_job(endpoint, name, "ddp_workloads:train", restartStrategy=strategy)
    job["spec"]["env"] += [{"name": k, "value": v} for k, v in {**STEADY, "WL_OUT": str(out), **env}.items()]
    return job


_STEADY: dict[str, torch.Tensor] = {}


@pytest.fixture
def steady_params(jobs: Jobs, s3_endpoint: str, podrunner: Path, tmp_path_factory) -> dict[str, torch.Tensor]:
    """The parameters of the same training never interrupted (run once, in the first test that asks)."""
    if not _STEADY:
        out = tmp_path_factory.mktemp("steady") / "params.pt"
        start_job(jobs, s3_endpoint, "steady", [], train_job(s3_endpoint, "steady", out, strategy=api.RESTART_RECREATE))
        status = jobs.wait_phase("steady", c.PHASE_SUCCEEDED, timeout=240)
        assert status["restarts"] == 0, status
        _STEADY.update(torch.load(out))
    return _STEADY


def attempt_causes(endpoint: str, namespace: str, name: str) -> dict[int, dict]:
    """What the job's rank 0 kept in S3 of why each attempt began, read as the client reads it."""
    found: dict[int, dict] = {}
    s3 = demo.s3_client(endpoint)
    prefix = f"results/{namespace}/{name}/"
    for item in s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{prefix}{layout.RESTARTS}/").get("Contents", []):
        attempt = layout.parse_attempt_cause(item["Key"].removeprefix(prefix))
        if attempt is not None:
            found[attempt] = json.loads(s3.get_object(Bucket=BUCKET, Key=item["Key"])["Body"].read())
    return found


def uids(jobs: Jobs, name: str) -> dict[str, str]:
    return {p.metadata.name: p.metadata.uid for p in jobs.pods(name)}


def pod_log(log_dir: Path, namespace: str, pod: str) -> str:
    return (log_dir / f"{namespace}_{pod}.log").read_text(errors="replace")


def test_failed_rank_processes_start_again_in_their_pods_and_the_job_ends_as_if_never_interrupted(
        jobs: Jobs, s3_endpoint: str, podrunner: Path, steady_params, tmp_path: Path) -> None:
    out = tmp_path / "params.pt"
    # Attempt 0: rank 1's code raises at step 6 (a program failure); attempt 1 resumes from step 4 and
    # rank 0's process is SIGKILLed at step 20 (infrastructure); attempt 2 resumes from step 20.
    job = train_job(s3_endpoint, "in-place", out, WL_RAISE_AT_STEP="6", WL_RAISE_ON_ATTEMPT="0",
                    WL_CRASH_AT_STEP="20", WL_STEP_SECONDS="0.05")
    start_job(jobs, s3_endpoint, "in-place", [], job)
    first = wait_until(lambda: (found := uids(jobs, "in-place")) and len(found) == 2 and found, 60, "both pods")

    status = jobs.wait_phase("in-place", c.PHASE_SUCCEEDED, timeout=300)
    assert (status["restarts"], status["programRestarts"], status["infrastructureRestarts"]) == (2, 1, 1), status
    assert status["attempt"] == 2 and status["recreatedAttempt"] == 0, status
    assert status["failedRank"]["rank"] == 0 and status["failedRank"]["exitCode"] == 137, status["failedRank"]
    pods = jobs.pods("in-place")
    assert {p.metadata.name: p.metadata.uid for p in pods} == first  # nothing was rescheduled
    assert {p.metadata.labels[labels.LABEL_ATTEMPT] for p in pods} == {"0"}
    restarts = [e.message for e in jobs.events("in-place") if e.reason in (c.REASON_RANK_FAILED,)]
    assert any("rank 1" in m and "RuntimeError: rank 1 fails at step 6 on attempt 0" in m and "in place" in m
               for m in restarts), restarts
    # Why each attempt began, as the Events said it, kept in S3 by the attempt's rank 0 for when they are gone.
    assert status["attemptCause"]["attempt"] == 2 and status["attemptCause"]["reason"] == c.REASON_RANK_FAILED
    causes = wait_until(lambda: (kept := attempt_causes(s3_endpoint, jobs.namespace, "in-place")) and len(kept) == 2
                        and kept, 30, "both restarts' causes in S3")
    said = {(e.reason, e.message) for e in jobs.events("in-place")}
    assert {(cause["reason"], cause["message"]) for cause in causes.values()} <= said, (causes, said)
    assert "RuntimeError: rank 1 fails at step 6 on attempt 0" in causes[1]["message"]
    assert causes[2] == status["attemptCause"] and "exited with code 137" in causes[2]["message"]
    # Each pod's output holds its attempts in order, each marked.
    for pod in first:
        said = pod_log(podrunner, jobs.namespace, pod)
        marks = [said.index(f"attempt {a}: starting the rank process in place") for a in range(3)]
        assert marks == sorted(marks), said[-3000:]
        # Once a gang formed, the pod's zygote had torch imported: the last attempt's process was forked.
        started = [line for line in said.splitlines() if "started 1 local rank (global" in line]
        assert len(started) == 3 and "1 forked by the zygote" in started[-1], started
    assert "rank 0 resumed from step 4" in pod_log(podrunner, jobs.namespace, "in-place-0")
    assert "rank 1 resumed from step 20" in pod_log(podrunner, jobs.namespace, "in-place-1")
    params = torch.load(out)
    assert params.keys() == steady_params.keys()
    assert all(torch.equal(params[k], steady_params[k]) for k in params)  # resumed exactly, twice


def test_a_deleted_pod_is_the_only_one_replaced(jobs: Jobs, s3_endpoint: str, podrunner: Path,
                                                steady_params, tmp_path: Path) -> None:
    out = tmp_path / "params.pt"
    start_job(jobs, s3_endpoint, "one-gone", [], train_job(s3_endpoint, "one-gone", out, WL_STEP_SECONDS="0.2"))
    wait_until(lambda: (jobs.status("one-gone").get("lastCheckpoint") or {}).get("step", 0) >= 8, 120,
               "a checkpoint at step 8")
    before = uids(jobs, "one-gone")
    pid = rank_pid(jobs.namespace, "one-gone", 0, supervised=True)
    jobs.core.delete_namespaced_pod("one-gone-1", jobs.namespace)

    status = jobs.wait_phase("one-gone", c.PHASE_SUCCEEDED, timeout=300)
    assert status["restarts"] == 1 and status["infrastructureRestarts"] == 1, status
    after = {p.metadata.name: (p.metadata.uid, p.metadata.labels[labels.LABEL_ATTEMPT]) for p in jobs.pods("one-gone")}
    assert after["one-gone-0"] == (before["one-gone-0"], "0")  # kept: its runtime restarted its process
    assert after["one-gone-1"][0] != before["one-gone-1"] and after["one-gone-1"][1] == "1"
    assert pid is not None and rank_pid(jobs.namespace, "one-gone", 0, supervised=True) is None  # that process ended
    params = torch.load(out)
    assert all(torch.equal(params[k], steady_params[k]) for k in params)


def test_the_same_bug_twice_in_place_still_fails_the_job_as_deterministic(
        jobs: Jobs, s3_endpoint: str, podrunner: Path) -> None:
    job = workload_job(s3_endpoint, "buggy-in-place", "ddp_workloads:fail_at_step", backoffLimit=5,
                       restartStrategy=api.RESTART_IN_PLACE)
    start_job(jobs, s3_endpoint, "buggy-in-place", [], job)
    status = jobs.wait_phase("buggy-in-place", c.PHASE_FAILED, timeout=180)
    assert status["reason"] == c.REASON_DETERMINISTIC and status["restarts"] == 1, status
    failed = status["failedRank"]
    assert failed["rank"] == 1 and failed["step"] == 3 and failed["attempt"] == 1, failed
    assert "Traceback" in failed["message"] and "ValueError: a bug that fires at step 3" in failed["message"]
    # Its pod stays, ended by its runtime with the rank's code, for its log; the survivor's was deleted.
    ended = wait_until(lambda: [p for p in jobs.pods("buggy-in-place") if p.status.phase == "Failed"], 60,
                       "rank 1's pod ended")
    assert [p.metadata.name for p in ended] == ["buggy-in-place-1"]
    assert "ValueError: a bug that fires at step 3" in pod_log(podrunner, jobs.namespace, "buggy-in-place-1")


def test_a_command_job_without_the_trainer_runtime_cannot_restart_in_place(jobs: Jobs) -> None:
    job = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "cmd-in-place"},
           "spec": {"worldSize": 2, "image": "busybox", "command": ["sleep", "1"], "restartStrategy": "InPlace",
                    "trainerRuntime": "Off"}}
    with pytest.raises(Exception) as refused:
        jobs.custom.create_namespaced_custom_object(api.GROUP, api.VERSION, jobs.namespace,
                                                          api.PLURAL, job)
    assert "restartStrategy InPlace restarts rank processes inside their pods" in str(refused.value)
    job["spec"]["trainerRuntime"] = "Auto"  # the runtime runs it where the image has it
    jobs.custom.create_namespaced_custom_object(api.GROUP, api.VERSION, jobs.namespace, api.PLURAL, job)



def test_an_in_place_restart_that_does_not_form_in_time_recreates_the_pods_it_kept(
        jobs: Jobs, s3_endpoint: str, podrunner: Path, steady_params, tmp_path: Path) -> None:
    out, mark = tmp_path / "params.pt", tmp_path / "blocked"
    job = train_job(s3_endpoint, "stuck-rejoin", out, WL_RAISE_AT_STEP="6", WL_RAISE_ON_ATTEMPT="0",
                    WL_MARK=str(mark))
    # Time enough for the kept gang's rank 1 to reach its block on a loaded machine, rather than be recreated first.
    job["spec"].update(entrypoint="rejoin_workloads:train", inPlaceDeadlineSeconds=15)
    start_job(jobs, s3_endpoint, "stuck-rejoin", [], job)
    first = wait_until(lambda: (found := uids(jobs, "stuck-rejoin")) and len(found) == 2 and found, 60, "both pods")

    status = jobs.wait_phase("stuck-rejoin", c.PHASE_SUCCEEDED, timeout=300)
    assert mark.exists()  # rank 1 did block on attempt 1
    assert status["restarts"] == 1 and status["attempt"] == 1 and status["recreatedAttempt"] == 1, status
    timed_out = [e.message for e in jobs.events("stuck-rejoin") if e.reason == c.REASON_IN_PLACE_TIMED_OUT]
    assert len(timed_out) == 1 and "stuck-rejoin-0, stuck-rejoin-1" in timed_out[0], timed_out
    last = {p.metadata.name: (p.metadata.uid, p.metadata.labels[labels.LABEL_ATTEMPT]) for p in jobs.pods("stuck-rejoin")}
    assert all(uid != first[name] and label == "1" for name, (uid, label) in last.items()), (first, last)
    params = torch.load(out)
    assert all(torch.equal(params[k], steady_params[k]) for k in params)


def test_with_memory_snapshots_a_restart_resumes_from_the_gangs_memory_and_from_s3_only_once_every_pod_is_gone(
        jobs: Jobs, s3_endpoint: str, podrunner: Path, steady_params, tmp_path: Path) -> None:
    """Attempt 0: rank 1's code raises at step 6, after the S3 checkpoint of step 4: attempt 1 resumes at step 6
    from memory. Then pod 1 is deleted: its replacement gets the state from pod 0's memory over the pod network
    (the job's token). Then both pods are deleted: nothing is left in memory and attempt 3 resumes from S3.
    The job ends with the parameters of the run never interrupted, bit for bit."""
    out, name = tmp_path / "params.pt", "from-memory"
    job = train_job(s3_endpoint, name, out, WL_MEMORY_EVERY="1", WL_RAISE_AT_STEP="6", WL_RAISE_ON_ATTEMPT="0",
                    WL_STEP_SECONDS="0.3")
    start_job(jobs, s3_endpoint, name, [], job)

    def checkpoint_in(attempt: int, step: int) -> bool:
        status = jobs.status(name)
        return status.get("attempt") == attempt and (status.get("lastCheckpoint") or {}).get("step", 0) >= step

    wait_until(lambda: checkpoint_in(1, 12), 120, "attempt 1 past step 12")
    assert jobs.status(name)["recovery"]["source"] == "Memory"
    jobs.core.delete_namespaced_pod(f"{name}-1", jobs.namespace)
    wait_until(lambda: checkpoint_in(2, 24), 120, "attempt 2 past step 24")
    for pod in (f"{name}-0", f"{name}-1"):
        jobs.core.delete_namespaced_pod(pod, jobs.namespace)

    status = jobs.wait_phase(name, c.PHASE_SUCCEEDED, timeout=300)
    assert status["attempt"] == 3, status
    kept = wait_until(lambda: (found := recoveries_kept(s3_endpoint, jobs.namespace, name)) and len(found) == 3
                      and found, 30, "the three recoveries in S3")
    assert kept[3] == status["recovery"]
    first, replaced, everything_lost = kept[1], kept[2], kept[3]
    assert (first["source"], first["step"]) == ("Memory", 6) and first["stepsLost"] <= 1, first
    assert replaced["source"] == "Memory" and replaced["pods"] == [f"{name}-0"] and replaced["stepsLost"] <= 1, replaced
    assert replaced["step"] >= 12
    assert everything_lost["source"] == "S3" and everything_lost["step"] % 4 == 0 and "stepsLost" not in everything_lost
    assert everything_lost["checkpoint"].endswith(f"step-{everything_lost['step']:012d}")
    assert f"rank 1 resumed from step {replaced['step']}" in pod_log(podrunner, jobs.namespace, f"{name}-1")
    assert status["memorySnapshots"]["copies"] == 2 and status["memorySnapshots"]["bytes"] > 0, status
    params = torch.load(out)
    assert all(torch.equal(params[k], steady_params[k]) for k in params)  # resumed exactly, three times


def test_a_spare_pod_takes_a_deleted_pods_place_and_the_pod_comes_back_as_the_next_spare(
        jobs: Jobs, s3_endpoint: str, podrunner: Path, steady_params, tmp_path: Path) -> None:
    """sparePods 1: pod 1 is deleted after a checkpoint; the spare (pod 2), waiting with its zygote, takes
    rank 1's place at once, its rank process forked, and gets the state from pod 0's memory; pod 1 is
    created again and waits as the next spare. The job ends with the parameters of the run never
    interrupted, bit for bit."""
    out, name, ns = tmp_path / "params.pt", "spared", jobs.namespace
    job = train_job(s3_endpoint, name, out, WL_MEMORY_EVERY="1", WL_STEP_SECONDS="0.2")
    job["spec"]["sparePods"] = 1
    start_job(jobs, s3_endpoint, name, [], job)
    spare_log = podrunner / f"{ns}_{name}-2.log"
    wait_until(lambda: spare_log.exists() and "this pod is a spare" in spare_log.read_text(errors="replace"), 120,
               "the spare waiting")
    wait_until(lambda: (jobs.status(name).get("lastCheckpoint") or {}).get("step", 0) >= 8, 120, "a checkpoint at step 8")
    assert jobs.status(name)["members"] == [0, 1]
    before = uids(jobs, name)
    jobs.core.delete_namespaced_pod(f"{name}-1", ns)
    wait_until(lambda: uids(jobs, name).get(f"{name}-1") not in (None, before[f"{name}-1"]), 60,
               "pod 1 created again, to wait as the next spare")

    status = jobs.wait_phase(name, c.PHASE_SUCCEEDED, timeout=300)
    assert (status["restarts"], status["infrastructureRestarts"], status["members"]) == (1, 1, [0, 2]), status
    said = [e.message for e in jobs.events(name) if "takes the place" in e.message]
    assert any(f"spare {name}-2 takes the place of {name}-1 (rank 1)" in m for m in said), said
    spare = pod_log(podrunner, ns, f"{name}-2")
    started = [line for line in spare.splitlines() if "started 1 local rank (global" in line]
    assert len(started) == 1 and "(global 1), 1 forked by the zygote" in started[0], started
    recovery = status["recovery"]
    assert (recovery["source"], recovery["pods"]) == ("Memory", [f"{name}-0"]) and recovery["stepsLost"] <= 1, recovery
    assert f"rank 1 resumed from step {recovery['step']}" in spare
    params = torch.load(out)
    assert all(torch.equal(params[k], steady_params[k]) for k in params)  # resumed exactly, in the spare
