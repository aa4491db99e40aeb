"""restartStrategy InPlace in the operator's pure functions: which pods make the gang across attempts
(podsummary), which a restart replaces (decision), what status keeps (statuspatch), the spec and the
ranks' manifests."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from ddp_contract import api, envnames
from ddp_contract.exitcodes import ExitCode
from ddp_contract.failureline import format_line
from ddp_contract.jobstatus import STATUS_ATTEMPT_TIME, STATUS_PROCESS_FAILURES
from ddp_contract.timestamps import rfc3339
from ddp_operator import constants as c
from ddp_operator.decision import Action, Decision, decide
from ddp_operator.manifests import build_pod
from ddp_operator.podsummary import summarize_pods
from ddp_operator.spec import InvalidSpec, parse_spec
from ddp_operator.statuspatch import compute_status, events_for, next_phase, pod_attempt_floor
from podfixtures import JOB, NOW, job_spec, pod

IN_PLACE = {"restartStrategy": api.RESTART_IN_PLACE}


def reported(attempt: int, exit_code: int = 1, **more: Any) -> dict[str, Any]:
    return {"attempt": attempt, "exitCode": exit_code, "reason": "Error", "finishedAt": "2025-01-02T03:00:00Z",
            "message": "Traceback (most recent call last):\n" + format_line(1, 7, 1, "USER_ERROR", False, "ValueError: x"),
            **more}


def test_the_gang_is_every_pod_labelled_from_the_recreated_attempt_up_to_the_current_one() -> None:
    pods = [pod(0, attempt=0), pod(1, attempt=2), pod(2, attempt=3)]
    summary = summarize_pods(pods, 3, job_name=JOB, since=2)
    assert summary.live_indices == {1, 2} and summary.stale_pods == (f"{JOB}-0",)
    assert summarize_pods(pods, 3, job_name=JOB).live_indices == {2}  # Recreate: the current attempt's only


def test_a_pod_whose_delete_was_issued_is_old_whatever_its_label() -> None:
    failed = pod(1, "failed", attempt=0)
    summary = summarize_pods([pod(0, attempt=0), failed], 1, job_name=JOB, since=0, replaced={failed["metadata"]["uid"]})
    assert summary.failure is None and summary.live_indices == {0} and summary.stale_pods == (f"{JOB}-1",)


def test_a_process_failure_its_runtime_reported_is_the_ranks_failure_for_that_attempt_only() -> None:
    pods = [pod(0, attempt=0), pod(1, attempt=0, node="gpu-2")]
    summary = summarize_pods(pods, 2, job_name=JOB, since=0, process_failures={"1": reported(2)})
    failure = summary.failure
    assert failure is not None and (failure.pod_index, failure.exit_code, failure.attempt) == (1, 1, 2)
    assert failure.pod == f"{JOB}-1" and failure.node == "gpu-2" and failure.kind == c.KIND_PROGRAM
    assert failure.line is not None and failure.line.step == 7  # the runtime's line: deterministic checks work
    assert summarize_pods(pods, 3, job_name=JOB, since=0, process_failures={"1": reported(2)}).failure is None
    hung = summarize_pods(pods, 2, job_name=JOB, since=0, process_failures={"1": reported(2, ExitCode.HUNG)}).failure
    assert hung is not None and hung.reason == c.RUNTIME_EXIT_REASONS[ExitCode.HUNG] and hung.kind == c.KIND_INFRASTRUCTURE
    oom = summarize_pods(pods, 2, job_name=JOB, since=0, process_failures={"1": reported(2, 137, reason="OOMKilled")}).failure
    assert oom is not None and oom.oom_killed and oom.kind == c.KIND_PROGRAM


def test_a_carried_pods_failure_belongs_to_the_current_attempt() -> None:
    summary = summarize_pods([pod(0, attempt=0), pod(1, "failed", attempt=0, exit_code=137)], 1, job_name=JOB, since=0)
    assert summary.failure is not None and summary.failure.attempt == 1


def test_an_in_place_restart_replaces_only_the_pods_that_cannot_go_on() -> None:
    spec = job_spec(worldSize=4, **IN_PLACE)
    pods = [pod(0), pod(1, "failed", exit_code=1), pod(2, "succeeded"), pod(3)]
    decision = decide(spec, status={"phase": "Running"}, summary=summarize_pods(pods, 0, job_name=JOB), now=NOW)
    assert decision.action == Action.RESTART and decision.attempt == 1
    assert decision.delete_pods == (f"{JOB}-1", f"{JOB}-2")
    assert "restarting in place" in decision.message
    recreate = decide(job_spec(worldSize=4), status={"phase": "Running"}, summary=summarize_pods(pods, 0, job_name=JOB), now=NOW)
    assert recreate.delete_pods == tuple(f"{JOB}-{r}" for r in range(4))


def test_a_process_failure_restarts_in_place_deleting_nothing() -> None:
    spec = job_spec(**IN_PLACE)
    summary = summarize_pods([pod(0), pod(1)], 0, job_name=JOB, since=0, process_failures={"1": reported(0)})
    decision = decide(spec, status={"phase": "Running"}, summary=summary, now=NOW)
    assert decision.action == Action.RESTART and decision.delete_pods == () and decision.failure is not None


def test_a_pod_on_a_lost_node_is_replaced_and_the_rest_stay() -> None:
    spec = job_spec(**IN_PLACE)
    summary = summarize_pods([pod(0, node="a"), pod(1, node="b")], 0, job_name=JOB, lost_nodes={"b": "node b is gone"})
    decision = decide(spec, status={"phase": "Running"}, summary=summary, now=NOW)
    assert decision.action == Action.RESTART and decision.delete_pods == (f"{JOB}-1",)


def test_after_an_in_place_restart_the_kept_pods_are_the_new_attempts_and_only_the_missing_rank_is_created() -> None:
    spec = job_spec(worldSize=3, **IN_PLACE)
    status = {"phase": "Restarting", "attempt": 1, "recreatedAttempt": 0, "restarts": 1}
    summary = summarize_pods([pod(0), pod(2)], 1, job_name=JOB, since=pod_attempt_floor(status))
    decision = decide(spec, status=status, summary=summary, now=NOW)
    assert decision.action == Action.CREATE and decision.create_indices == (1,) and decision.delete_pods == ()


def test_status_keeps_the_recreated_attempt_in_place_and_moves_it_on_recreate() -> None:
    pods = [pod(0), pod(1, "failed", exit_code=1)]
    status = {"phase": "Running", "attempt": 0, STATUS_PROCESS_FAILURES: {"0": reported(0)}}
    for changes, floor in ((IN_PLACE, 0), ({}, 1)):
        spec = job_spec(**changes)
        summary = summarize_pods(pods, 0, job_name=JOB)
        decision = decide(spec, status=status, summary=summary, now=NOW)
        patch = compute_status(spec, status=status, summary=summary, decision=decision, now=NOW)
        assert (patch["attempt"], patch["recreatedAttempt"]) == (1, floor)
        assert STATUS_PROCESS_FAILURES in patch and patch[STATUS_PROCESS_FAILURES] is None
    quiet = compute_status(job_spec(), status={"attempt": 2}, summary=summarize_pods([], 2, job_name=JOB), decision=decide(
        job_spec(), status={"attempt": 2}, summary=summarize_pods([], 2, job_name=JOB), now=NOW), now=NOW)
    assert quiet["recreatedAttempt"] == 2 and STATUS_PROCESS_FAILURES not in quiet


def test_in_place_the_phase_stays_restarting_until_rank_0_records_the_new_gang() -> None:
    spec = job_spec(**IN_PLACE)
    summary = summarize_pods([pod(0), pod(1)], 1, job_name=JOB, since=0)
    status: dict[str, Any] = {"phase": c.PHASE_RESTARTING, "attempt": 1, "rendezvous": {"attempt": 0}}
    decision = Decision(Action.WAIT, 1)
    assert next_phase(status, summary, decision, spec) == c.PHASE_RESTARTING
    status["rendezvous"] = {"attempt": 1}
    assert next_phase(status, summary, decision, spec) == c.PHASE_RUNNING
    assert next_phase({**status, "rendezvous": {"attempt": 0}}, summary, decision, job_spec()) == c.PHASE_RUNNING


def test_the_spec_takes_a_restart_strategy_and_refuses_in_place_for_a_command_without_the_runtime() -> None:
    assert job_spec().restart_strategy == api.RESTART_RECREATE and not job_spec().in_place
    assert job_spec(**IN_PLACE).in_place
    with pytest.raises(InvalidSpec, match="restartStrategy: must be one of InPlace, Recreate"):
        job_spec(restartStrategy="Sometimes")
    command = {"worldSize": 2, "image": "trainer:1", "command": ["python", "train.py"], **IN_PLACE}
    assert parse_spec(command).in_place  # the runtime runs it (trainerRuntime Auto, the default)
    with pytest.raises(InvalidSpec, match="restartStrategy: InPlace restarts rank processes inside their pods"):
        parse_spec({**command, "trainerRuntime": "Off"})
    with pytest.raises(InvalidSpec, match="trainerRuntime: Off is for a command"):
        job_spec(trainerRuntime="Off")


def test_in_place_ranks_are_told_so_and_recreate_ranks_are_not() -> None:
    def env_of(spec_changes: dict[str, Any]) -> dict[str, str]:
        job = {"metadata": {"name": JOB, "namespace": "team-a", "uid": "u"},
               "spec": {"worldSize": 2, "image": "trainer:1", "entrypoint": "train:main", **spec_changes}}
        built = build_pod(job, parse_spec(job["spec"]), 1, 0)
        return {e["name"]: e.get("value") for e in built["spec"]["containers"][0]["env"]}

    assert env_of(IN_PLACE)[envnames.RESTART_STRATEGY] == api.RESTART_IN_PLACE
    assert envnames.RESTART_STRATEGY not in env_of({})


def overdue_case(started_s_ago: float, deadline: int = 180, **status_changes: Any) -> tuple[Any, dict, Any]:
    spec = job_spec(inPlaceDeadlineSeconds=deadline, **IN_PLACE)
    restarted = rfc3339(NOW - timedelta(seconds=600))
    status: dict[str, Any] = {"phase": c.PHASE_RESTARTING, "attempt": 1, "recreatedAttempt": 0,
                              "rendezvous": {"attempt": 0}, "conditions": [
                                  {"type": c.COND_RESTARTING, "status": "True", "lastTransitionTime": restarted}],
                              **status_changes}
    started = rfc3339(NOW - timedelta(seconds=started_s_ago))
    pods = [pod(0, attempt=0), pod(1, attempt=1)]
    pods[1]["status"]["containerStatuses"][0]["state"]["running"]["startedAt"] = started
    return spec, status, summarize_pods(pods, 1, job_name=JOB, since=0)


def test_an_in_place_restart_that_does_not_form_in_time_recreates_the_pods_it_kept() -> None:
    spec, status, summary = overdue_case(started_s_ago=181)
    decision = decide(spec, status=status, summary=summary, now=NOW)
    assert decision.action == Action.RECREATE and decision.attempt == 1 and decision.delete_pods == (f"{JOB}-0",)
    assert decision.reason == c.REASON_IN_PLACE_TIMED_OUT and "inPlaceDeadlineSeconds=180" in decision.message
    patch = compute_status(spec, status=status, summary=summary, decision=decision, now=NOW)
    assert (patch["phase"], patch["attempt"], patch["recreatedAttempt"], patch["restarts"]) == (
        c.PHASE_RESTARTING, 1, 1, 0)
    assert events_for(status, patch) == [("Warning", c.REASON_IN_PLACE_TIMED_OUT, decision.message)]


def test_the_deadline_counts_from_the_last_pod_running_and_only_while_the_gang_has_not_formed() -> None:
    spec, status, summary = overdue_case(started_s_ago=100)  # the replacement started 100 s ago
    decision = decide(spec, status=status, summary=summary, now=NOW)
    assert decision.action == Action.WAIT and decision.recheck_after == pytest.approx(80)
    spec, status, summary = overdue_case(started_s_ago=500, rendezvous={"attempt": 1})
    assert decide(spec, status=status, summary=summary, now=NOW).action == Action.WAIT  # formed: nothing is overdue
    spec, status, summary = overdue_case(started_s_ago=500)
    pending = summarize_pods([pod(0, attempt=0), pod(1, "pending", attempt=1)], 1, job_name=JOB, since=0)
    assert decide(spec, status=status, summary=pending, now=NOW).action != Action.RECREATE  # a rank still starting is not overdue


def test_a_restart_that_follows_another_while_restarting_has_its_own_deadline() -> None:
    """The Restarting condition keeps the first restart's time while the job stays Restarting; the
    deadline of the restart after it counts from status.attemptTime, which that restart moved."""
    spec, status, summary = overdue_case(started_s_ago=900, attemptTime=rfc3339(NOW - timedelta(seconds=100)))
    decision = decide(spec, status=status, summary=summary, now=NOW)
    assert decision.action == Action.WAIT and decision.recheck_after == pytest.approx(80)
    spec, status, summary = overdue_case(started_s_ago=900, attemptTime=rfc3339(NOW - timedelta(seconds=181)))
    assert decide(spec, status=status, summary=summary, now=NOW).action == Action.RECREATE


def test_the_attempt_time_moves_with_the_attempt_only() -> None:
    spec = job_spec(**IN_PLACE)
    summary = summarize_pods([pod(0), pod(1)], 1, job_name=JOB, since=0)
    before = rfc3339(NOW - timedelta(seconds=300))
    status = {"phase": c.PHASE_RUNNING, "attempt": 1, "recreatedAttempt": 0, STATUS_ATTEMPT_TIME: before}
    waiting = Decision(Action.WAIT, 1)
    assert compute_status(spec, status=status, summary=summary, decision=waiting, now=NOW)[STATUS_ATTEMPT_TIME] == before
    restart = Decision(Action.RESTART, 2, c.REASON_RANK_FAILED, "rank 1 failed")
    assert compute_status(spec, status=status, summary=summary, decision=restart, now=NOW)[STATUS_ATTEMPT_TIME] == rfc3339(NOW)
    created = compute_status(spec, status={}, summary=summary, decision=Decision(Action.CREATE, 0), now=NOW)
    assert created[STATUS_ATTEMPT_TIME] == rfc3339(NOW)


def test_a_job_failed_by_a_rank_process_keeps_that_pod_until_its_runtime_ends_it() -> None:
    spec = job_spec(restartPolicy="Never", **IN_PLACE)
    summary = summarize_pods([pod(0), pod(1)], 0, job_name=JOB, since=0, process_failures={"1": reported(0)})
    decision = decide(spec, status={"phase": "Running"}, summary=summary, now=NOW)
    assert decision.action == Action.FAIL and decision.delete_pods == (f"{JOB}-0",)
    failed = {"phase": c.PHASE_FAILED, "failedRank": {"pod": f"{JOB}-1"},
              "completionTime": rfc3339(NOW - timedelta(seconds=10))}
    waiting = decide(spec, status=failed, summary=summarize_pods([pod(1)], 0, job_name=JOB), now=NOW)
    assert waiting.delete_pods == () and waiting.recheck_after == pytest.approx(20)
    late = decide(spec, status={**failed, "completionTime": rfc3339(NOW - timedelta(seconds=31))},
                  summary=summarize_pods([pod(1)], 0, job_name=JOB), now=NOW)
    assert late.delete_pods == (f"{JOB}-1",)  # it did not end by itself: stopped as any survivor is
