"""The InPlace runtime's pure parts: who supervises, the OOM counter, the report, the attempt's env.
The loop itself runs in real processes against the operator: tests/e2e/test_in_place_restart.py and
tests/localcluster/test_real_node_training.py."""

from __future__ import annotations

from pathlib import Path

from ddp_contract import envnames
from ddp_trainer.jobwatch import JobView
from ddp_trainer.runtime.inplace import attempt_env, failure_report, is_in_place, oom_kills


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
