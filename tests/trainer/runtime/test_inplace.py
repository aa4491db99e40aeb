"""The InPlace runtime's pure parts: who supervises, the OOM counter, the report, the attempt's env (an
elastic job's gang included).
The loop itself runs in real processes against the operator: tests/e2e/test_in_place_restart.py and
tests/localcluster/test_real_node_training.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_contract import envnames
from ddp_trainer.jobwatch import JobView
from ddp_trainer.runtime.inplace import (
    CheckpointRequest,
    attempt_env,
    failure_report,
    gang_env,
    is_in_place,
    oom_kills,
)
from ddp_trainer.runtime.supervisor import local_rank_env


def test_only_the_containers_first_process_of_an_in_place_job_supervises() -> None:
    assert is_in_place({envnames.RESTART_STRATEGY: "InPlace"})
    assert not is_in_place({envnames.RESTART_STRATEGY: "InPlace", envnames.SUPERVISED: "1"})
    assert not is_in_place({envnames.RESTART_STRATEGY: "Recreate"}) and not is_in_place({})


def test_oom_kills_are_read_from_cgroup_v2_else_v1_and_none_where_neither_says(tmp_path: Path) -> None:
    v2, v1 = tmp_path / "memory.events", tmp_path / "memory.oom_control"
    v1.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 4\n")
    assert oom_kills((v2, v1)) == 4
    v2.write_text("low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n")
    assert oom_kills((v2, v1)) == 2
    (tmp_path / "old").write_text("oom_kill_disable 0\nunder_oom 0\n")  # a kernel before 4.13 counts none
    assert oom_kills((tmp_path / "missing", tmp_path / "old")) is None


def test_the_report_says_what_the_kubelet_would_have_said() -> None:
    report = failure_report(2, 137, "x" * 5000, oom_killed=True, now=0.0)
    assert report == {"attempt": 2, "exitCode": 137, "reason": "OOMKilled", "message": "x" * 4096,
                      "finishedAt": "1970-01-01T00:00:00Z"}
    assert failure_report(0, 1, "boom", oom_killed=False, now=0.0)["reason"] == "Error"


def test_each_attempt_runs_with_its_number_and_the_newest_checkpoint() -> None:
    pod_env = {envnames.ATTEMPT: "0", envnames.RESUME_FROM: "s3://b/ck/step-4", "RANK": "1"}
    child = attempt_env(pod_env, JobView(2, "s3://b/ck/step-20", "Restarting"), 2)
    assert child[envnames.ATTEMPT] == "2" and child[envnames.RESUME_FROM] == "s3://b/ck/step-20"
    assert child[envnames.SUPERVISED] == "1" and child["RANK"] == "1"
    assert attempt_env(pod_env, JobView(1, None, None), 1)[envnames.RESUME_FROM] == "s3://b/ck/step-4"


def _pod_env(index: int, pods: int, per_pod: int = 1, master: str = "train-0.train.ns.svc") -> dict[str, str]:
    """The env the operator gives pod `index` of a job of `pods` pods (spec.worldSize = pods x per_pod)."""
    ranks = ({envnames.RANK: str(index), envnames.LOCAL_RANK: "0"} if per_pod == 1
             else {envnames.GROUP_RANK: str(index)})
    return {envnames.JOB_NAME: "train", envnames.MASTER_ADDR: master, envnames.MASTER_PORT: "29500",
            envnames.WORLD_SIZE: str(pods * per_pod), envnames.TARGET_WORLD_SIZE: str(pods * per_pod),
            envnames.LOCAL_WORLD_SIZE: str(per_pod), envnames.NODE_RANK: str(index), **ranks}


def test_a_member_pod_of_one_rank_takes_its_place_in_the_gang_and_rank_0s_pod_as_master() -> None:
    assert gang_env(_pod_env(3, 4), (1, 3), 3) == {
        envnames.WORLD_SIZE: "2", envnames.RANK: "1", envnames.NODE_RANK: "1",
        envnames.MASTER_ADDR: "train-1.train.ns.svc",
        # and alike for a launcher the pod's command starts
        envnames.PET_NNODES: "2", envnames.PET_NODE_RANK: "1", envnames.PET_MASTER_ADDR: "train-1.train.ns.svc"}
    assert gang_env(_pod_env(1, 4), (1, 3), 1)[envnames.RANK] == "0"


def test_a_member_pod_of_several_ranks_gives_its_local_ranks_the_gangs_ranks() -> None:
    pod = _pod_env(2, 4, per_pod=4)
    changed = gang_env(pod, (2, 0), 2)
    assert changed == {envnames.WORLD_SIZE: "8", envnames.NODE_RANK: "0", envnames.GROUP_RANK: "0",
                       envnames.MASTER_ADDR: "train-2.train.ns.svc", envnames.PET_NNODES: "2",
                       envnames.PET_NODE_RANK: "0", envnames.PET_MASTER_ADDR: "train-2.train.ns.svc"}
    ranks = [local_rank_env({**pod, **changed}, local, "/dev/null") for local in range(4)]
    assert [r[envnames.RANK] for r in ranks] == ["0", "1", "2", "3"]
    second = {**_pod_env(0, 4, per_pod=4), **gang_env(_pod_env(0, 4, per_pod=4), (2, 0), 0)}
    assert [local_rank_env(second, local, "/dev/null")[envnames.RANK] for local in range(4)] == ["4", "5", "6", "7"]


@pytest.mark.parametrize("master", ["127.0.0.1", "train-07.train.ns.svc", "training-0.training.ns.svc", "train-0"])
def test_only_the_operators_name_for_pod_0_is_moved_to_the_gangs_first_pod(master: str) -> None:
    changed = gang_env(_pod_env(1, 4, master=master), (1, 2), 1)
    assert envnames.MASTER_ADDR not in changed and envnames.PET_MASTER_ADDR not in changed


def test_a_pod_outside_the_gang_has_no_env_in_it() -> None:
    with pytest.raises(ValueError, match=r"pod 2 is not in the gang \[0, 1\]"):
        gang_env(_pod_env(2, 4), (0, 1), 2)
    with pytest.raises(ValueError):
        attempt_env(_pod_env(2, 4), JobView(1, None, "Running", (0, 1)), 1)


def test_an_attempt_of_an_elastic_job_runs_in_its_gang_and_one_of_a_job_that_is_not_as_the_pod_was_made() -> None:
    pod = _pod_env(3, 4)
    child = attempt_env(pod, JobView(2, "s3://b/ck/step-20", "Running", (0, 3, 1)), 2)
    assert child[envnames.ATTEMPT] == "2" and child[envnames.RESUME_FROM] == "s3://b/ck/step-20"
    assert (child[envnames.WORLD_SIZE], child[envnames.RANK], child[envnames.NODE_RANK]) == ("3", "1", "1")
    assert child[envnames.MASTER_ADDR] == "train-0.train.ns.svc" and child[envnames.TARGET_WORLD_SIZE] == "4"
    assert attempt_env(pod, JobView(2, None, "Running"), 2) == {**pod, envnames.SUPERVISED: "1", envnames.ATTEMPT: "2"}


def test_the_rank_processes_are_told_of_a_checkpoint_request_while_the_job_has_one(tmp_path: Path) -> None:
    request = CheckpointRequest(tmp_path / "checkpoint-request")
    asked = JobView(3, None, "Running", (0, 1), checkpoint_requested="2026-11-24T23:00:00Z")
    request.sync(JobView(3, None, "Running", (0, 1)))
    assert not request.path.exists()
    request.sync(asked)
    assert request.path.read_text() == "2026-11-24T23:00:00Z"
    request.sync(JobView(4, "s3://b/c", "Restarting", (0, 1, 2)))  # answered: the job grew
    assert not request.path.exists()
    request.sync(None)
    assert not request.path.exists()
