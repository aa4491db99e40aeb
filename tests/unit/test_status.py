from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from ddp_operator import constants as c
from ddp_operator.spec import InvalidSpec, parse_spec
from ddp_operator.status import (
    Action,
    Decision,
    PodSummary,
    RankFailure,
    changed_fields,
    compute_status,
    deadline_exceeded,
    decide,
    format_time,
    get_condition,
    invalid_spec_status,
    is_retryable,
    next_phase,
    only_counts_changed,
    parse_time,
    requeue_after,
    set_condition,
    summarize_pods,
    ttl_expired,
)

NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
EARLIER = NOW - timedelta(minutes=10)
JOB = "mnist"


def job_spec(**changes: Any) -> Any:
    return parse_spec({"worldSize": 2, "image": "trainer:1", "entrypoint": "train:main", **changes})


def pod(
    rank: int,
    state: str = "running",
    attempt: int = 0,
    exit_code: int | None = None,
    reason: str | None = None,
    ready: bool = True,
    deleting: bool = False,
    finished_at: str = "2025-01-02T03:00:00Z",
    waiting: str | None = None,
) -> dict[str, Any]:
    """A pod as the API returns it. state: pending | running | succeeded | failed | evicted."""
    meta: dict[str, Any] = {
        "name": f"{JOB}-{rank}",
        "uid": f"uid-{rank}-{attempt}",
        "labels": {c.LABEL_JOB_NAME: JOB, c.LABEL_RANK: str(rank), c.LABEL_ATTEMPT: str(attempt)},
    }
    if deleting:
        meta["deletionTimestamp"] = "2025-01-02T03:04:00Z"
    container: dict[str, Any] = {"name": c.CONTAINER_NAME, "state": {}}
    status: dict[str, Any] = {"phase": "Pending", "containerStatuses": [container], "conditions": []}
    if state == "pending":
        container["state"] = {"waiting": {"reason": waiting or "ContainerCreating"}}
    elif state == "running":
        status["phase"] = "Running"
        container["state"] = {"running": {"startedAt": "2025-01-02T02:00:00Z"}}
        status["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
    elif state in ("succeeded", "failed"):
        code = exit_code if exit_code is not None else (0 if state == "succeeded" else 1)
        status["phase"] = "Succeeded" if code == 0 else "Failed"
        container["state"] = {
            "terminated": {
                "exitCode": code,
                "reason": reason or ("Completed" if code == 0 else "Error"),
                "finishedAt": finished_at,
            }
        }
    elif state == "evicted":
        status.update(phase="Failed", reason=reason or "Evicted", containerStatuses=[])
    return {"metadata": meta, "status": status}


def summary_of(*pods: dict[str, Any], attempt: int = 0) -> PodSummary:
    return summarize_pods(list(pods), attempt, JOB)


# --- summarize_pods ----------------------------------------------------------------------


def test_summary_counts_current_attempt_only() -> None:
    summary = summary_of(
        pod(0, "running"),
        pod(1, "running", ready=False),
        pod(2, "pending"),
        pod(3, "succeeded"),
        pod(4, "failed", exit_code=3),
        pod(5, "running", attempt=1),
        pod(6, "running", deleting=True),
    )
    assert (summary.pending, summary.running, summary.ready, summary.succeeded, summary.failed) == (1, 2, 1, 1, 1)
    assert summary.live_ranks == {0, 1, 2, 3, 4}
    assert summary.occupied_ranks == {0, 1, 2, 3, 4, 5, 6}
    assert summary.active_pods == ("mnist-0", "mnist-1", "mnist-2")
    assert summary.finished_pods == ("mnist-3", "mnist-4")
    assert summary.stale_pods == ("mnist-5",)
    assert summary.job_name == JOB


def test_summary_knows_each_pod_by_uid_so_a_delete_cannot_hit_its_successor() -> None:
    summary = summary_of(pod(0, attempt=1), pod(1, "running", attempt=0), attempt=1)
    assert summary.stale_pods == ("mnist-1",)
    assert summary.uids == {"mnist-0": "uid-0-1", "mnist-1": "uid-1-0"}


def test_summary_failure_carries_pod_exit_code_and_reason() -> None:
    failure = summary_of(pod(0), pod(1, "failed", exit_code=137, reason="OOMKilled")).failure
    assert failure == RankFailure(1, "mnist-1", 137, "OOMKilled", False, "2025-01-02T03:00:00Z")
    assert failure.as_status() == {"rank": 1, "pod": "mnist-1", "exitCode": 137, "reason": "OOMKilled"}
    assert "rank 1 (pod mnist-1) exited with code 137" in failure.describe()


def test_earliest_failure_is_reported_not_the_lowest_rank() -> None:
    summary = summary_of(
        pod(0, "failed", exit_code=1, finished_at="2025-01-02T03:02:00Z"),
        pod(1, "failed", exit_code=2, finished_at="2025-01-02T03:01:00Z"),
    )
    assert summary.failure is not None and summary.failure.rank == 1


@pytest.mark.parametrize(
    ("reason", "evicted"),
    [
        ("Evicted", True),
        ("NodeLost", True),
        ("Preempted", True),
        ("DeletionByTaintManager", True),
        ("OutOfnvidia.com/gpu", True),
        ("Something", False),
    ],
)
def test_evictions_are_recognised_by_pod_reason(reason: str, evicted: bool) -> None:
    failure = summary_of(pod(0, "evicted", reason=reason)).failure
    assert failure is not None and failure.evicted is evicted and failure.reason == reason
    assert failure.exit_code is None


def test_disruption_target_condition_marks_an_eviction() -> None:
    raw = pod(0, "failed", exit_code=143)
    raw["status"]["conditions"] = [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]
    failure = summary_of(raw).failure
    assert failure is not None and failure.evicted and failure.exit_code == 143


def test_trainer_exit_decides_even_when_a_sidecar_keeps_the_pod_running() -> None:
    raw = pod(0, "running")
    raw["status"]["containerStatuses"] = [
        {"name": "logger", "state": {"running": {}}},
        {"name": c.CONTAINER_NAME, "state": {"terminated": {"exitCode": 0}}},
    ]
    summary = summary_of(raw)
    assert summary.succeeded == 1 and summary.running == 0 and summary.finished_pods == ("mnist-0",)


def test_stuck_pending_reasons_are_collected() -> None:
    summary = summary_of(pod(0, "pending", waiting="ImagePullBackOff"), pod(1, "pending"))
    assert summary.problems == ("rank 0: ImagePullBackOff",)


def test_pods_without_rank_labels_are_stale() -> None:
    stray = {"metadata": {"name": "mnist-x", "labels": {c.LABEL_JOB_NAME: JOB}}, "status": {"phase": "Running"}}
    summary = summary_of(stray)
    assert summary.stale_pods == ("mnist-x",) and summary.total == 0


# --- is_retryable --------------------------------------------------------------------------


def failure(exit_code: int | None = 1, evicted: bool = False) -> RankFailure:
    return RankFailure(0, "mnist-0", exit_code, "Error", evicted)


@pytest.mark.parametrize(
    ("policy", "exit_code", "evicted", "retryable"),
    [
        ("OnFailure", 1, False, True),
        ("OnFailure", 137, False, True),
        ("OnFailure", None, True, True),
        ("Never", 137, False, False),
        ("Never", None, True, False),
        ("ExitCode", 1, False, False),
        ("ExitCode", 127, False, False),
        ("ExitCode", 128, False, True),
        ("ExitCode", 137, False, True),
        ("ExitCode", 255, False, True),
        ("ExitCode", None, True, True),
        ("ExitCode", 1, True, True),
        ("ExitCode", None, False, True),
    ],
)
def test_is_retryable(policy: str, exit_code: int | None, evicted: bool, retryable: bool) -> None:
    assert is_retryable(policy, failure(exit_code, evicted)) is retryable


# --- decide ----------------------------------------------------------------------------


def test_new_job_creates_every_rank() -> None:
    decision = decide(job_spec(worldSize=3), {}, summary_of(), NOW)
    assert decision.action == Action.CREATE and decision.create_ranks == (0, 1, 2) and decision.attempt == 0


def test_only_missing_ranks_are_created() -> None:
    decision = decide(job_spec(worldSize=3), {"phase": "Pending"}, summary_of(pod(1, "pending")), NOW)
    assert decision.create_ranks == (0, 2)


def test_all_ranks_present_waits() -> None:
    decision = decide(job_spec(), {"phase": "Running"}, summary_of(pod(0), pod(1)), NOW)
    assert decision == Decision(Action.WAIT, 0)


def test_old_attempt_pods_are_deleted_and_their_ranks_wait_for_the_name() -> None:
    summary = summary_of(pod(0, "running", attempt=0), pod(1, "running", attempt=0, deleting=True), attempt=1)
    decision = decide(job_spec(), {"phase": "Restarting", "attempt": 1, "restarts": 1}, summary, NOW)
    assert decision.action == Action.WAIT
    assert decision.delete_pods == ("mnist-0",) and decision.create_ranks == ()


def test_after_the_old_gang_is_gone_the_new_attempt_is_created() -> None:
    decision = decide(job_spec(), {"phase": "Restarting", "attempt": 1, "restarts": 1}, summary_of(attempt=1), NOW)
    assert decision.action == Action.CREATE and decision.create_ranks == (0, 1) and decision.attempt == 1


def test_all_ranks_succeeded_succeeds() -> None:
    decision = decide(job_spec(), {"phase": "Running"}, summary_of(pod(0, "succeeded"), pod(1, "succeeded")), NOW)
    assert decision.action == Action.SUCCEED and decision.reason == c.REASON_SUCCEEDED


def test_rank_zero_alone_succeeding_is_not_success() -> None:
    decision = decide(job_spec(), {"phase": "Running"}, summary_of(pod(0, "succeeded"), pod(1)), NOW)
    assert decision.action == Action.WAIT


@pytest.mark.parametrize(
    ("policy", "state", "exit_code", "reason", "action", "decision_reason"),
    [
        ("OnFailure", "failed", 1, None, Action.RESTART, c.REASON_RANK_FAILED),
        ("OnFailure", "evicted", None, "Evicted", Action.RESTART, c.REASON_RANK_EVICTED),
        ("Never", "failed", 137, None, Action.FAIL, c.REASON_PERMANENT),
        ("Never", "evicted", None, "NodeLost", Action.FAIL, c.REASON_PERMANENT),
        ("ExitCode", "failed", 2, None, Action.FAIL, c.REASON_PERMANENT),
        ("ExitCode", "failed", 137, "OOMKilled", Action.RESTART, c.REASON_RANK_FAILED),
        ("ExitCode", "evicted", None, "Preempted", Action.RESTART, c.REASON_RANK_EVICTED),
    ],
)
def test_failed_rank_by_policy(
    policy: str, state: str, exit_code: int | None, reason: str | None, action: Action, decision_reason: str
) -> None:
    summary = summary_of(pod(0), pod(1, state, exit_code=exit_code, reason=reason))
    decision = decide(job_spec(restartPolicy=policy), {"phase": "Running", "restarts": 0}, summary, NOW)
    assert decision.action == action and decision.reason == decision_reason
    assert decision.failure is not None and decision.failure.rank == 1
    assert "rank 1 (pod mnist-1)" in decision.message
    if exit_code is not None:
        assert f"code {exit_code}" in decision.message


def test_gang_restart_deletes_every_pod_and_bumps_the_attempt() -> None:
    summary = summary_of(pod(0), pod(1, "failed"), pod(2, "succeeded"), pod(3, "running", attempt=7))
    decision = decide(job_spec(worldSize=3), {"phase": "Running", "restarts": 1, "attempt": 0}, summary, NOW)
    assert decision.action == Action.RESTART and decision.attempt == 1
    assert decision.delete_pods == ("mnist-0", "mnist-1", "mnist-2", "mnist-3")
    assert "restart 2 of 3" in decision.message


@pytest.mark.parametrize(
    ("restarts", "limit", "action"), [(2, 3, Action.RESTART), (3, 3, Action.FAIL), (0, 0, Action.FAIL)]
)
def test_backoff_limit(restarts: int, limit: int, action: Action) -> None:
    summary = summary_of(pod(0), pod(1, "failed", exit_code=1))
    decision = decide(job_spec(backoffLimit=limit), {"phase": "Running", "restarts": restarts}, summary, NOW)
    assert decision.action == action
    if action == Action.FAIL:
        assert decision.reason == c.REASON_BACKOFF_LIMIT
        assert "exited with code 1" in decision.message and "mnist-1" in decision.message
        assert decision.delete_pods == ("mnist-0",)  # the survivor stops; the failed pod stays for its logs


def test_rank_lost_after_the_gang_formed_restarts_it() -> None:
    decision = decide(job_spec(), {"phase": "Running", "attempt": 0}, summary_of(pod(0)), NOW)
    assert decision.action == Action.RESTART and decision.reason == c.REASON_RANK_EVICTED
    assert decision.failure == RankFailure(1, "mnist-1", None, c.REASON_RANK_MISSING, True)


def test_rank_being_deleted_after_the_gang_formed_restarts_it() -> None:
    decision = decide(job_spec(), {"phase": "Running"}, summary_of(pod(0), pod(1, deleting=True)), NOW)
    assert decision.action == Action.RESTART and decision.failure is not None and decision.failure.rank == 1


def test_rank_lost_before_the_gang_formed_is_just_recreated() -> None:
    decision = decide(job_spec(), {"phase": "Starting"}, summary_of(pod(0)), NOW)
    assert decision.action == Action.CREATE and decision.create_ranks == (1,)


def test_suspend_deletes_every_pod() -> None:
    summary = summary_of(pod(0), pod(1, "succeeded"), pod(2, attempt=3))
    decision = decide(job_spec(worldSize=3, suspend=True), {"phase": "Running"}, summary, NOW)
    assert decision.action == Action.SUSPEND and decision.delete_pods == ("mnist-0", "mnist-1", "mnist-2")


def test_resume_recreates_once_pods_are_gone() -> None:
    spec = job_spec()
    assert decide(spec, {"phase": "Suspended"}, summary_of(pod(0, deleting=True)), NOW).create_ranks == (1,)
    assert decide(spec, {"phase": "Suspended"}, summary_of(), NOW).create_ranks == (0, 1)


def test_deadline_fails_and_stops_running_ranks() -> None:
    status = {"phase": "Running", "startTime": format_time(NOW - timedelta(seconds=61))}
    decision = decide(job_spec(activeDeadlineSeconds=60), status, summary_of(pod(0), pod(1, "pending")), NOW)
    assert decision.action == Action.FAIL and decision.reason == c.REASON_DEADLINE
    assert decision.delete_pods == ("mnist-0", "mnist-1")
    assert "activeDeadlineSeconds=60" in decision.message


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_finished_jobs_only_stop_leftovers(phase: str) -> None:
    status = {"phase": phase, "reason": "R", "message": "M"}
    decision = decide(job_spec(suspend=True), status, summary_of(pod(0), pod(1, "failed")), NOW)
    assert decision == Decision(Action.WAIT, 0, "R", "M", delete_pods=("mnist-0",))


# --- deadline, TTL ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("deadline", "started", "phase", "expected"),
    [
        (60, 61, "Running", True),
        (60, 60, "Running", True),
        (60, 59, "Running", False),
        (None, 10_000, "Running", False),
        (60, None, "Suspended", False),
        (60, 61, "Succeeded", False),
    ],
)
def test_deadline_exceeded(deadline: int | None, started: int | None, phase: str, expected: bool) -> None:
    status: dict[str, Any] = {"phase": phase}
    if started is not None:
        status["startTime"] = format_time(NOW - timedelta(seconds=started))
    spec = job_spec(**({"activeDeadlineSeconds": deadline} if deadline else {}))
    assert deadline_exceeded(status, spec, NOW) is expected


@pytest.mark.parametrize(
    ("ttl", "finished", "phase", "expected"),
    [
        (0, 0, "Succeeded", True),
        (100, 101, "Failed", True),
        (100, 99, "Succeeded", False),
        (None, 10_000, "Succeeded", False),
        (0, None, "Succeeded", False),
        (0, 5, "Running", False),
    ],
)
def test_ttl_expired(ttl: int | None, finished: int | None, phase: str, expected: bool) -> None:
    status: dict[str, Any] = {"phase": phase}
    if finished is not None:
        status["completionTime"] = format_time(NOW - timedelta(seconds=finished))
    spec = job_spec(**({"ttlSecondsAfterFinished": ttl} if ttl is not None else {}))
    assert ttl_expired(status, spec, NOW) is expected


def test_requeue_after_is_the_nearest_due_time() -> None:
    spec = job_spec(activeDeadlineSeconds=100, ttlSecondsAfterFinished=30)
    assert requeue_after({"phase": "Running", "startTime": format_time(NOW - timedelta(seconds=40))}, spec, NOW) == 60
    assert (
        requeue_after({"phase": "Failed", "completionTime": format_time(NOW - timedelta(seconds=50))}, spec, NOW) == 0
    )
    assert requeue_after({"phase": "Running"}, spec, NOW) is None


# --- set_condition -----------------------------------------------------------------------


def test_set_condition_adds_and_keeps_transition_time_until_the_status_flips() -> None:
    first = set_condition([], "Running", True, "AllRanksReady", "ok", EARLIER, 1)
    assert first == [
        {
            "type": "Running",
            "status": "True",
            "reason": "AllRanksReady",
            "message": "ok",
            "lastTransitionTime": format_time(EARLIER),
            "observedGeneration": 1,
        }
    ]
    same = set_condition(first, "Running", "True", "AllRanksReady", "still ok", NOW, 2)
    assert same[0]["lastTransitionTime"] == format_time(EARLIER)
    assert same[0]["message"] == "still ok" and same[0]["observedGeneration"] == 2
    flipped = set_condition(same, "Running", False, "RankFailed", "rank 1", NOW, 2)
    assert flipped[0]["lastTransitionTime"] == format_time(NOW) and flipped[0]["status"] == "False"
    assert first[0]["message"] == "ok"  # inputs are not mutated


def test_set_condition_leaves_other_conditions_alone() -> None:
    conditions = set_condition([], "Created", True, "PodsCreated", "", EARLIER)
    conditions = set_condition(conditions, "Running", True, "AllRanksReady", "", NOW)
    assert [cond["type"] for cond in conditions] == ["Created", "Running"]
    assert "observedGeneration" not in conditions[0]


# --- compute_status ------------------------------------------------------------------------


def status_after(spec: Any, status: dict[str, Any], summary: PodSummary, now: datetime = NOW) -> dict[str, Any]:
    return compute_status(spec, status, summary, decide(spec, status, summary, now), now, generation=4)


def test_status_of_a_new_job() -> None:
    patch = status_after(job_spec(), {}, summary_of())
    assert patch["phase"] == c.PHASE_PENDING
    assert (patch["readyRanks"], patch["totalRanks"], patch["ready"]) == (0, 2, "0/2")
    assert (patch["attempt"], patch["restarts"], patch["observedGeneration"]) == (0, 0, 4)
    assert patch["startTime"] == format_time(NOW) and patch["completionTime"] is None
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
    patch = status_after(job_spec(), {"phase": previous, "startTime": format_time(EARLIER)}, summary_of(*pods))
    assert patch["phase"] == phase


def test_running_status_and_conditions() -> None:
    patch = status_after(
        job_spec(), {"phase": "Starting", "startTime": format_time(EARLIER)}, summary_of(pod(0), pod(1))
    )
    assert patch["ready"] == "2/2" and patch["startTime"] == format_time(EARLIER)
    running = get_condition(patch["conditions"], c.COND_RUNNING)
    assert running["status"] == "True" and running["reason"] == c.REASON_ALL_READY
    assert running["lastTransitionTime"] == format_time(NOW)


def test_restart_status() -> None:
    status = {
        "phase": "Running",
        "attempt": 0,
        "restarts": 1,
        "startTime": format_time(EARLIER),
        "conditions": set_condition([], c.COND_RUNNING, True, c.REASON_ALL_READY, "", EARLIER),
    }
    patch = status_after(job_spec(), status, summary_of(pod(0), pod(1, "failed", exit_code=1)))
    assert patch["phase"] == c.PHASE_RESTARTING
    assert (patch["attempt"], patch["restarts"]) == (1, 2)
    assert patch["failedRank"] == {"rank": 1, "pod": "mnist-1", "exitCode": 1, "reason": "Error"}
    assert patch["reason"] == c.REASON_RANK_FAILED and "mnist-1" in patch["message"]
    assert get_condition(patch["conditions"], c.COND_RUNNING)["status"] == "False"
    assert get_condition(patch["conditions"], c.COND_RESTARTING)["status"] == "True"
    assert patch["completionTime"] is None


def test_restarting_keeps_its_reason_until_the_new_gang_runs() -> None:
    status = {"phase": "Restarting", "attempt": 1, "restarts": 1, "reason": c.REASON_RANK_FAILED, "message": "m"}
    patch = status_after(job_spec(), status, summary_of(attempt=1))
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
        job_spec(**spec_changes), {"phase": "Running", "startTime": format_time(EARLIER)}, summary_of(*pods)
    )
    assert (patch["phase"], patch["reason"]) == (phase, reason)
    assert patch["completionTime"] == format_time(NOW)
    assert get_condition(patch["conditions"], condition)["status"] == "True"


def test_terminal_status_is_final() -> None:
    finished = {
        "phase": "Failed",
        "reason": c.REASON_PERMANENT,
        "message": "rank 1 ...",
        "completionTime": format_time(EARLIER),
        "failedRank": {"rank": 1},
    }
    patch = status_after(job_spec(), finished, summary_of(pod(0, "succeeded"), pod(1, "succeeded")))
    assert (patch["phase"], patch["reason"], patch["message"]) == ("Failed", c.REASON_PERMANENT, "rank 1 ...")
    assert patch["completionTime"] == format_time(EARLIER)
    assert "failedRank" not in patch


def test_suspend_clears_start_time_and_resume_sets_it_again() -> None:
    running = {"phase": "Running", "startTime": format_time(EARLIER)}
    suspended = status_after(job_spec(suspend=True), running, summary_of(pod(0), pod(1)))
    assert suspended["phase"] == c.PHASE_SUSPENDED and suspended["startTime"] is None
    assert get_condition(suspended["conditions"], c.COND_SUSPENDED)["status"] == "True"
    later = NOW + timedelta(hours=1)
    resumed = status_after(job_spec(), {**running, **suspended, "startTime": None}, summary_of(), later)
    assert resumed["phase"] == c.PHASE_PENDING and resumed["startTime"] == format_time(later)
    condition = get_condition(resumed["conditions"], c.COND_SUSPENDED)
    assert condition["status"] == "False" and condition["lastTransitionTime"] == format_time(later)


def test_waiting_message_names_stuck_ranks() -> None:
    patch = status_after(
        job_spec(), {"phase": "Pending"}, summary_of(pod(0, "pending", waiting="ErrImagePull"), pod(1))
    )
    assert "rank 0: ErrImagePull" in patch["message"]


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
    assert patch["observedGeneration"] == 3 and patch["completionTime"] == format_time(NOW)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("2025-01-02T03:04:05Z", NOW), ("2025-01-02T03:04:05+00:00", NOW), (None, None), ("", None)],
)
def test_parse_time(value: str | None, expected: datetime | None) -> None:
    assert parse_time(value) == expected


def test_format_time_treats_naive_as_utc() -> None:
    assert format_time(NOW.replace(tzinfo=None)) == "2025-01-02T03:04:05Z"


# --- which patches may wait ---------------------------------------------------------------


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
    assert changed_fields(*passes[3]) == {"readyRanks", "ready", "message"}
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
