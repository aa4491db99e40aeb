"""restartStrategy Recreate (modes/recreate.py): a restart replaces the whole gang, finished pods, older
attempts' and an elastic job's waiting pods included; the next attempt is new pods."""

from __future__ import annotations

from ddp_operator.decision import Action, decide
from ddp_operator.modes import recreate
from ddp_operator.podsummary import summarize_pods
from podfixtures import JOB, NOW, job_spec, pod, summary_of


def test_gang_restart_deletes_every_pod_and_bumps_the_attempt() -> None:
    summary = summary_of(pod(0), pod(1, "failed"), pod(2, "succeeded"), pod(3, "running", attempt=7))
    status = {"phase": "Running", "restarts": 1, "programRestarts": 1, "attempt": 0}
    decision = decide(job_spec(worldSize=3), status=status, summary=summary, now=NOW)
    assert decision.action == Action.RESTART and decision.attempt == 1
    assert decision.delete_pods == ("mnist-0", "mnist-1", "mnist-2", "mnist-3")
    assert "program restart 2 of 3, backoffLimit" in decision.message


def test_a_restart_replaces_the_running_the_finished_and_the_old_pods_once_each() -> None:
    summary = summary_of(pod(0), pod(1, "failed"), pod(2, "pending"), pod(3, attempt=1), attempt=1)
    replaced = recreate.replaced_by_restart(summary, summary.running_pods, summary.replaced_anyway)
    assert replaced == (f"{JOB}-0", f"{JOB}-1", f"{JOB}-2", f"{JOB}-3") == summary.every_pod()
    assert summary.stale_pods == (f"{JOB}-0", f"{JOB}-1", f"{JOB}-2") and summary.active_pods == (f"{JOB}-3",)


def test_an_elastic_job_s_waiting_pods_go_with_the_gang() -> None:
    pods = [pod(0), pod(1, "failed"), pod(2, "pending"), pod(3, "succeeded")]
    summary = summarize_pods(pods, 0, job_name=JOB, members=(0, 1))
    assert summary.waiting.names == (f"{JOB}-2",) and summary.waiting.ended == (f"{JOB}-3",)
    replaced = recreate.replaced_by_restart(summary, summary.running_pods, summary.replaced_anyway)
    assert replaced == tuple(f"{JOB}-{i}" for i in range(4))
