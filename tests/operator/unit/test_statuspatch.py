"""compute_status and friends: the status patch a decision leads to."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from ddp_contract.exitcodes import ExitCode
from ddp_contract.failureline import format_line
from ddp_contract.timestamps import rfc3339
from ddp_operator import constants as c
from ddp_operator.decision import Action, Decision, decide
from ddp_operator.podsummary import PodSummary
from ddp_operator.spec import InvalidSpec, parse_spec
from ddp_operator.statuspatch import (
    changed_fields,
    compute_status,
    events_for,
    failed_pass_status,
    get_condition,
    invalid_spec_status,
    next_phase,
    only_counts_changed,
    set_condition,
)
from podfixtures import EARLIER, NOW, job_spec, pod, summary_of


def test_set_condition_adds_and_keeps_transition_time_until_the_status_flips() -> None:
    first = set_condition([], "Running", status=True, reason="AllRanksReady", message="ok", now=EARLIER, generation=1)
    assert first == [
        {
            "type": "Running",
            "status": "True",
            "reason": "AllRanksReady",
            "message": "ok",
            "lastTransitionTime": rfc3339(EARLIER),
            "observedGeneration": 1,
        }
    ]
    same = set_condition(first, "Running", status="True", reason="AllRanksReady", message="still ok", now=NOW, generation=2)
    assert same[0]["lastTransitionTime"] == rfc3339(EARLIER)
    assert same[0]["message"] == "still ok" and same[0]["observedGeneration"] == 2
    flipped = set_condition(same, "Running", status=False, reason="RankFailed", message="rank 1", now=NOW, generation=2)
    assert flipped[0]["lastTransitionTime"] == rfc3339(NOW) and flipped[0]["status"] == "False"
    assert first[0]["message"] == "ok"  # inputs are not mutated


def test_set_condition_leaves_other_conditions_alone() -> None:
    conditions = set_condition([], "Created", status=True, reason="PodsCreated", message="", now=EARLIER)
    conditions = set_condition(conditions, "Running", status=True, reason="AllRanksReady", message="", now=NOW)
    assert [cond["type"] for cond in conditions] == ["Created", "Running"]
    assert "observedGeneration" not in conditions[0]


# --- compute_status ------------------------------------------------------------------------


def status_after(spec: Any, status: dict[str, Any], summary: PodSummary, now: datetime = NOW) -> dict[str, Any]:
    decision = decide(spec, status=status, summary=summary, now=now)
    return compute_status(spec, status=status, summary=summary, decision=decision, now=now, generation=4)


def test_status_of_a_new_job() -> None:
    patch = status_after(job_spec(), {}, summary_of())
    assert patch["phase"] == c.PHASE_PENDING
    assert (patch["readyRanks"], patch["totalRanks"], patch["ready"]) == (0, 2, "0/2")
    assert (patch["attempt"], patch["restarts"], patch["observedGeneration"]) == (0, 0, 4)
    assert patch["startTime"] == rfc3339(NOW) and patch["completionTime"] is None
    assert get_condition(patch["conditions"], c.COND_CREATED)["status"] == "True"
    assert patch["reason"] == c.REASON_WAITING


@pytest.mark.parametrize(
    ("pods", "previous", "phase"),
    [
        ([pod(0, "pending"), pod(1, "pending")], "Pending", c.PHASE_PENDING),
        ([pod(0, "running"), pod(1, "pending")], "Pending", c.PHASE_STARTING),
        ([pod(0, "running"), pod(1, "running", ready=False)], "Starting", c.PHASE_STARTING),
        ([pod(0, "running"), pod(1, "running")], "Starting", c.PHASE_RUNNING),
        ([pod(0, "running"), pod(1, "succeeded")], "Running", c.PHASE_RUNNING),
        ([pod(0, "running"), pod(1, "pending")], "Restarting", c.PHASE_RESTARTING),
        ([pod(0, "running"), pod(1, "running")], "Restarting", c.PHASE_RUNNING),
        ([pod(0, "succeeded"), pod(1, "succeeded")], "Running", c.PHASE_SUCCEEDED),
    ],
)
def test_phase_progression(pods: list[dict[str, Any]], previous: str, phase: str) -> None:
    patch = status_after(job_spec(), {"phase": previous, "startTime": rfc3339(EARLIER)}, summary_of(*pods))
    assert patch["phase"] == phase


def test_running_status_and_conditions() -> None:
    patch = status_after(
        job_spec(), {"phase": "Starting", "startTime": rfc3339(EARLIER)}, summary_of(pod(0), pod(1))
    )
    assert patch["ready"] == "2/2" and patch["startTime"] == rfc3339(EARLIER)
    running = get_condition(patch["conditions"], c.COND_RUNNING)
    assert running["status"] == "True" and running["reason"] == c.REASON_ALL_READY
    assert running["lastTransitionTime"] == rfc3339(NOW)


def test_restart_status() -> None:
    status = {
        "phase": "Running",
        "attempt": 0,
        "restarts": 1,
        "startTime": rfc3339(EARLIER),
        "conditions": set_condition([], c.COND_RUNNING, status=True, reason=c.REASON_ALL_READY, message="", now=EARLIER),
    }
    failed = pod(1, "failed", exit_code=1, node="gpu-3", output="Traceback ...\nValueError: bad batch")
    patch = status_after(job_spec(), status, summary_of(pod(0), failed))
    assert patch["phase"] == c.PHASE_RESTARTING
    assert (patch["attempt"], patch["restarts"]) == (1, 2)
    assert (patch["programRestarts"], patch["infrastructureRestarts"]) == (1, 0)
    assert patch["failedRank"] == {"rank": 1, "pod": "mnist-1", "node": "gpu-3", "exitCode": 1, "signal": None,
                                   "oomKilled": False, "reason": "Error",
                                   "message": "Traceback ...\nValueError: bad batch", "kind": "Program",
                                   "attempt": 0, "step": None}
    assert "on node gpu-3" in patch["message"]
    assert patch["reason"] == c.REASON_RANK_FAILED and "mnist-1" in patch["message"]
    assert get_condition(patch["conditions"], c.COND_RUNNING)["status"] == "False"
    assert get_condition(patch["conditions"], c.COND_RESTARTING)["status"] == "True"
    assert patch["completionTime"] is None
    events = events_for(status, patch)
    assert patch["attemptCause"] == {"attempt": 1, "reason": events[0][1], "message": events[0][2],
                                     "time": rfc3339(NOW)}  # the words of the restart's Event


def test_restarting_keeps_its_reason_until_the_new_gang_runs() -> None:
    status = {"phase": "Restarting", "attempt": 1, "restarts": 1, "reason": c.REASON_RANK_FAILED, "message": "m"}
    patch = status_after(job_spec(), status, summary_of(attempt=1))
    assert "attemptCause" not in patch  # said when the attempt began, not again
    assert (patch["phase"], patch["reason"], patch["message"], patch["restarts"]) == (
        "Restarting",
        c.REASON_RANK_FAILED,
        "m",
        1,
    )


@pytest.mark.parametrize(
    ("spec_changes", "pods", "phase", "reason", "condition"),
    [
        ({}, [pod(0, "succeeded"), pod(1, "succeeded")], c.PHASE_SUCCEEDED, c.REASON_SUCCEEDED, c.COND_SUCCEEDED),
        (
            {"restartPolicy": "Never"},
            [pod(0), pod(1, "failed", exit_code=3)],
            c.PHASE_FAILED,
            c.REASON_PERMANENT,
            c.COND_FAILED,
        ),
        ({"backoffLimit": 0}, [pod(0), pod(1, "failed")], c.PHASE_FAILED, c.REASON_BACKOFF_LIMIT, c.COND_FAILED),
    ],
)
def test_terminal_status(
    spec_changes: dict[str, Any], pods: list[dict[str, Any]], phase: str, reason: str, condition: str
) -> None:
    patch = status_after(
        job_spec(**spec_changes), {"phase": "Running", "startTime": rfc3339(EARLIER)}, summary_of(*pods)
    )
    assert (patch["phase"], patch["reason"]) == (phase, reason)
    assert patch["completionTime"] == rfc3339(NOW)
    assert get_condition(patch["conditions"], condition)["status"] == "True"


def test_terminal_status_is_final() -> None:
    finished = {
        "phase": "Failed",
        "reason": c.REASON_PERMANENT,
        "message": "rank 1 ...",
        "completionTime": rfc3339(EARLIER),
        "failedRank": {"rank": 1},
    }
    patch = status_after(job_spec(), finished, summary_of(pod(0, "succeeded"), pod(1, "succeeded")))
    assert (patch["phase"], patch["reason"], patch["message"]) == ("Failed", c.REASON_PERMANENT, "rank 1 ...")
    assert patch["completionTime"] == rfc3339(EARLIER)
    assert "failedRank" not in patch


def test_suspend_clears_start_time_and_resume_sets_it_again() -> None:
    running = {"phase": "Running", "startTime": rfc3339(EARLIER)}
    suspended = status_after(job_spec(suspend=True), running, summary_of(pod(0), pod(1)))
    assert suspended["phase"] == c.PHASE_SUSPENDED and suspended["startTime"] is None
    assert get_condition(suspended["conditions"], c.COND_SUSPENDED)["status"] == "True"
    later = NOW + timedelta(hours=1)
    resumed = status_after(job_spec(), {**running, **suspended, "startTime": None}, summary_of(), later)
    assert resumed["phase"] == c.PHASE_PENDING and resumed["startTime"] == rfc3339(later)
    condition = get_condition(resumed["conditions"], c.COND_SUSPENDED)
    assert condition["status"] == "False" and condition["lastTransitionTime"] == rfc3339(later)


def test_a_held_up_gang_says_why_by_rank_in_reason_message_and_condition() -> None:
    held = summary_of(pod(0, "pending", waiting="ErrImagePull", waiting_message="not found"), pod(1))
    patch = status_after(job_spec(), {"phase": "Pending"}, held)
    assert patch["reason"] == "ImagePullError"
    assert patch["message"] == "1/2 ranks ready, 2 pods exist; rank 0 (ImagePullError): not found"
    blocked = get_condition(patch["conditions"], c.COND_RANKS_BLOCKED)
    assert (blocked["status"], blocked["reason"], blocked["message"]) == ("True", "ImagePullError",
                                                                         "rank 0 (ImagePullError): not found")
    assert events_for({"phase": "Pending"}, patch) == [("Warning", "ImagePullError", blocked["message"])]
    # Nothing new: no Event again. Cleared: the condition turns False, no Warning.
    assert events_for(patch, status_after(job_spec(), patch, held)) == []
    cleared = status_after(job_spec(), patch, summary_of(pod(0), pod(1)))
    assert get_condition(cleared["conditions"], c.COND_RANKS_BLOCKED)["status"] == "False"
    assert events_for(patch, cleared) == [("Normal", c.REASON_ALL_READY, "2 ranks ready, 0 finished")]


def test_after_a_gang_restart_what_holds_the_new_gang_up_is_the_reason_and_the_restart_s_cause_is_kept() -> None:
    """A gang restarted for a failure, whose new ranks then cannot be scheduled (as after a lost node):
    `kubectl get ddpjobs` shows Unschedulable, not the old failure; the Restarting condition keeps it."""
    spec = job_spec()
    running = {**status_after(spec, {}, summary_of(pod(0), pod(1)))}
    restarted = {**running, **status_after(spec, running, summary_of(pod(0), pod(1, "failed", exit_code=137)))}
    assert restarted["phase"] == c.PHASE_RESTARTING and restarted["attempt"] == 1
    why = get_condition(restarted["conditions"], c.COND_RESTARTING)
    assert why["status"] == "True" and why["reason"] == restarted["reason"] != "Unschedulable"
    held = summary_of(pod(0, "pending", attempt=1, unschedulable="0/8 nodes are available: 8 Insufficient nvidia.com/gpu."),
                      pod(1, "pending", attempt=1, unschedulable="0/8 nodes are available: 8 Insufficient nvidia.com/gpu."),
                      attempt=1)
    waiting = {**restarted, **status_after(spec, restarted, held)}
    assert waiting["phase"] == c.PHASE_RESTARTING and waiting["reason"] == "Unschedulable"
    assert "ranks 0-1 (Unschedulable): 0/8 nodes are available" in waiting["message"]
    assert get_condition(waiting["conditions"], c.COND_RESTARTING) == why
    freed = status_after(spec, waiting, summary_of(pod(0, "pending", attempt=1), pod(1, "pending", attempt=1), attempt=1))
    assert (freed["phase"], freed["reason"], freed["message"]) == (c.PHASE_RESTARTING, why["reason"], why["message"])


def test_next_phase_without_a_decision_reason() -> None:
    decision = Decision(Action.WAIT, 0)
    assert next_phase({}, summary_of(pod(0), pod(1)), decision, job_spec()) == c.PHASE_RUNNING


def test_invalid_spec_status_fails_naming_the_field() -> None:
    with pytest.raises(InvalidSpec) as caught:
        parse_spec({"worldSize": 0, "image": "x", "entrypoint": "a:b"})
    patch = invalid_spec_status(caught.value, {}, NOW, 3)
    assert patch["phase"] == c.PHASE_FAILED and patch["reason"] == c.REASON_INVALID_SPEC
    assert patch["message"].startswith("spec.worldSize: ")
    assert get_condition(patch["conditions"], c.COND_FAILED)["status"] == "True"
    assert patch["observedGeneration"] == 3 and patch["completionTime"] == rfc3339(NOW)


def test_a_failed_status_pass_is_said_once_keeping_the_phase_and_never_over_an_end() -> None:
    message = "the operator's status pass failed on this job: OverflowError: date value out of range"
    assert failed_pass_status({}, message) == {"phase": c.PHASE_PENDING, "reason": c.REASON_RECONCILE_ERROR,
                                               "message": message}
    running = {"phase": c.PHASE_RUNNING, "reason": c.REASON_ALL_READY, "message": "2 ranks ready"}
    said = failed_pass_status(running, message)
    assert said == {"phase": c.PHASE_RUNNING, "reason": c.REASON_RECONCILE_ERROR, "message": message}
    assert failed_pass_status({**running, **said}, message) is None, "said already"
    assert failed_pass_status({**running, **said}, message + " again") is not None, "other words are said"
    assert failed_pass_status({"phase": c.PHASE_FAILED, "reason": c.REASON_BACKOFF_LIMIT}, message) is None


def gang_coming_up(spec: Any, steps: list[list[dict[str, Any]]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(status before, patch) for each pass as the pods move through steps, each patch applied."""
    status: dict[str, Any] = {}
    passes = []
    for pods in steps:
        patch = status_after(spec, status, summary_of(*pods))
        passes.append((status, patch))
        status = {**status, **patch}
    return passes


def test_only_rank_counts_moving_may_wait_but_phase_changes_may_not() -> None:
    spec = job_spec(worldSize=3)
    passes = gang_coming_up(spec, [
        [],  # new job: Pending, Created
        [pod(0, "pending"), pod(1, "pending"), pod(2, "pending")],  # "3 pods exist": counts only
        [pod(0), pod(1, "pending"), pod(2, "pending")],  # Starting: a phase change
        [pod(0), pod(1), pod(2, "pending")],  # 2/3 ready: counts only
        [pod(0), pod(1), pod(2)],  # Running
        [pod(0), pod(1), pod(2)],  # nothing changes
    ])
    assert [p["phase"] for _, p in passes] == ["Pending", "Pending", "Starting", "Starting", "Running", "Running"]
    assert [only_counts_changed(before, patch) for before, patch in passes] == [False, True, False, True, False, False]
    assert changed_fields(*passes[3]) == {"readyRanks", "readyPods", "ready", "message"}
    assert changed_fields(*passes[-1]) == frozenset()


def test_a_restart_or_a_condition_change_is_never_only_counts() -> None:
    running = {"phase": "Running", "readyRanks": 2, "ready": "2/2", "restarts": 0, "message": "2 ranks ready",
               "conditions": [{"type": "Running", "status": "True", "reason": "AllRanksReady", "message": "a"}]}
    assert only_counts_changed(running, {**running, "readyRanks": 1, "ready": "1/2", "message": "1 ranks ready"})
    assert not only_counts_changed(running, {**running, "readyRanks": 1, "restarts": 1})
    flipped = [{"type": "Running", "status": "False", "reason": "RankFailed", "message": "b"}]
    assert not only_counts_changed(running, {**running, "readyRanks": 1, "conditions": flipped})
    reworded = [{"type": "Running", "status": "True", "reason": "AllRanksReady", "message": "b"}]
    assert only_counts_changed(running, {**running, "message": "x", "conditions": reworded})
    # progress and other fields the operator does not own are never its changes
    assert changed_fields(running, {"progress": {"step": 3}}) == frozenset()


def test_a_hung_rank_restarts_the_gang_with_reason_hung_on_the_infrastructure_budget() -> None:
    line = format_line(1, 40, ExitCode.HUNG, "HUNG", True,
                       "no progress for 300s since step 40 (hang timeout 300s); stacks in s3://b/r/hangs/attempt-0/rank-1.txt")
    hung = pod(1, "failed", exit_code=ExitCode.HUNG, reason="Error", output=line)
    status = {"phase": "Running", "attempt": 0, "restarts": 1, "programRestarts": 1}
    patch = status_after(job_spec(), status, summary_of(pod(0), hung))
    assert patch["reason"] == c.REASON_HUNG and patch["failedRank"]["reason"] == c.REASON_HUNG
    assert (patch["restarts"], patch["programRestarts"], patch["infrastructureRestarts"]) == (2, 1, 1)
    assert "stacks in s3://b/r/hangs/attempt-0/rank-1.txt" in patch["message"]
    assert patch["failedRank"]["step"] == 40 and patch["failedRank"]["kind"] == c.KIND_INFRASTRUCTURE


def test_ranks_and_pods_are_counted_apart_when_pods_hold_several_ranks() -> None:
    spec = job_spec(worldSize=8, ranksPerPod=4)
    patch = status_after(spec, {"phase": "Starting"}, summary_of(pod(0), pod(1, ready=False)))
    assert (patch["readyRanks"], patch["totalRanks"], patch["readyPods"], patch["totalPods"]) == (4, 8, 1, 2)
    assert patch["ready"] == "4/8" and patch["phase"] == c.PHASE_STARTING
    running = status_after(spec, {"phase": "Starting"}, summary_of(pod(0), pod(1)))
    assert running["phase"] == c.PHASE_RUNNING and running["ready"] == "8/8"
    done = decide(spec, status={"phase": "Running"}, summary=summary_of(pod(0, "succeeded"), pod(1, "succeeded")), now=NOW)
    assert done.action == Action.SUCCEED and "all 8 ranks exited 0" in done.message
