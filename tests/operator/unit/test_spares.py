"""Spare pods (spec.sparePods, modes/spares.py): warm pods beyond the gang's; a restart that loses a
member's pod puts a running spare in its place, and the lost pod is created again as the next spare."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from ddp_contract import api
from ddp_contract.jobstatus import STATUS_MEMBERS
from ddp_contract.resource import JobStatus
from ddp_contract.timestamps import rfc3339
from ddp_operator import constants as c
from ddp_operator import modes
from ddp_operator.decision import Action, decide
from ddp_operator.kueue.rules import build_workload
from ddp_operator.manifests import build_pod
from ddp_operator.modes.spares import members
from ddp_operator.podsummary import summarize_pods
from ddp_operator.spec import InvalidSpec, parse_spec
from ddp_operator.statuspatch import compute_status
from podfixtures import JOB, NOW, job_spec, pod

SPARED = {"worldSize": 3, "sparePods": 1, "restartStrategy": api.RESTART_IN_PLACE}
FORMED = {"phase": c.PHASE_RUNNING, "attempt": 1, "recreatedAttempt": 0, "rendezvous": {"attempt": 1},
          "startTime": rfc3339(NOW - timedelta(minutes=5))}


def spec(**changes: Any) -> Any:
    return job_spec(**{**SPARED, **changes})


def summary(pods: list[dict[str, Any]], status: dict[str, Any]) -> Any:
    return summarize_pods(pods, int(status.get("attempt", 0)), job_name=JOB, since=int(status.get("recreatedAttempt", 0)),
                          members=modes.of(spec()).members(JobStatus.of(status)))


def test_spares_need_in_place_restarts_and_a_fixed_size() -> None:
    assert spec().spare_pods == 1 and spec().pods == 3 and spec().all_pods == 4
    assert type(modes.of(spec())) is modes.Spared and not spec().elastic
    assert job_spec(worldSize=3).all_pods == 3
    with pytest.raises(InvalidSpec, match="sparePods.*restartStrategy InPlace"):
        parse_spec({**SPARED, "image": "t:1", "entrypoint": "t:m", "restartStrategy": api.RESTART_RECREATE})
    with pytest.raises(InvalidSpec, match="sparePods.*fixed size"):
        spec(minWorldSize=2)
    with pytest.raises(InvalidSpec, match="sparePods.*between 0 and 64"):
        spec(sparePods=65)


def test_every_pod_is_created_the_spares_after_the_gangs_indices_and_kueue_admits_them_all() -> None:
    decision = decide(spec(), status={}, summary=summary([], {}), now=NOW)
    assert decision.action == Action.CREATE and decision.create_indices == (0, 1, 2, 3)
    job = {"metadata": {"name": JOB, "namespace": "default", "uid": "u"}, "spec": {}}
    spare = build_pod(job, spec(), 3, 0)
    assert spare["metadata"]["name"] == f"{JOB}-3" and spare["spec"]["hostname"] == f"{JOB}-3"
    with pytest.raises(ValueError, match="outside 0..3"):
        build_pod(job, spec(), 4, 0)
    workload = build_workload(job, spec(), pod_spec=spare["spec"])
    assert workload["spec"]["podSets"][0]["count"] == 4


def test_the_gang_is_the_first_pods_and_a_spare_waits_apart_without_failing_it() -> None:
    found = summary([pod(0), pod(1), pod(2), pod(3)], FORMED)
    assert found.gang == (0, 1, 2) and found.waiting.running == {3} and found.failure is None
    decision = decide(spec(), status=FORMED, summary=found, now=NOW)
    assert decision.action == Action.WAIT
    patch = compute_status(spec(), status=FORMED, summary=found, decision=decision, now=NOW)
    assert patch[STATUS_MEMBERS] == [0, 1, 2] and patch["ready"] == "3/3" and patch["worldSize"] == 3


def test_a_lost_pod_s_place_goes_to_a_running_spare_and_the_pod_is_created_again() -> None:
    status = {**FORMED, STATUS_MEMBERS: [0, 1, 2]}
    restart = decide(spec(), status=status, summary=summary([pod(0), pod(2), pod(3)], status), now=NOW)
    assert restart.action == Action.RESTART and restart.members == (0, 3, 2)
    assert f"spare {JOB}-3 takes the place of {JOB}-1 (rank 1)" in restart.message
    after = {**status, "attempt": 2, "phase": c.PHASE_RESTARTING, "attemptTime": rfc3339(NOW),
             STATUS_MEMBERS: list(restart.members)}
    found = summary([pod(0), pod(2), pod(3)], after)
    assert found.gang == (0, 3, 2)  # rank order: the spare holds rank 1
    again = decide(spec(), status=after, summary=found, now=NOW)
    assert again.action == Action.CREATE and again.create_indices == (1,)  # the next spare


def test_a_pod_whose_trainer_ended_is_replaced_by_a_spare_but_a_rank_process_failure_keeps_its_place() -> None:
    status = {**FORMED, STATUS_MEMBERS: [0, 3, 2]}
    ended = decide(spec(), status=status, summary=summary([pod(0), pod(1), pod(2), pod(3, "failed")], status), now=NOW)
    assert ended.action == Action.RESTART and ended.members == (0, 1, 2) and ended.delete_pods == (f"{JOB}-3",)
    in_place = {**status, "processFailures": {"2": {"attempt": 1, "exitCode": 1, "reason": "Error"}}}
    kept = decide(spec(), status=in_place, summary=summarize_pods(
        [pod(0), pod(1), pod(2), pod(3)], 1, job_name=JOB, since=0, members=(0, 3, 2),
        process_failures=in_place["processFailures"]), now=NOW)
    assert kept.action == Action.RESTART and kept.members == (0, 3, 2) and kept.delete_pods == ()


def test_without_a_running_spare_the_lost_pod_keeps_its_place() -> None:
    status = {**FORMED, STATUS_MEMBERS: [0, 1, 2]}
    starting = pod(3, "pending", node="b")
    restart = decide(spec(), status=status, summary=summary([pod(0), pod(2), starting], status), now=NOW)
    assert restart.action == Action.RESTART and restart.members == (0, 1, 2)
    assert "spare" not in restart.message


def test_two_lost_pods_take_the_spares_in_order_and_the_rest_wait_for_their_own() -> None:
    two = spec(worldSize=4, sparePods=2)
    status = {**FORMED, STATUS_MEMBERS: [0, 1, 2, 3]}
    found = summarize_pods([pod(0), pod(2), pod(4), pod(5)], 1, job_name=JOB, since=0, members=(0, 1, 2, 3))
    assert decide(two, status=status, summary=found, now=NOW).members == (0, 4, 2, 5)
    one = summarize_pods([pod(0), pod(2), pod(5)], 1, job_name=JOB, since=0, members=(0, 1, 2, 3))
    assert decide(two, status=status, summary=one, now=NOW).members == (0, 5, 2, 3)


def test_recorded_members_are_kept_in_rank_order_where_they_name_the_gang_s_size_of_distinct_pods() -> None:
    assert members(spec(), (0, 3, 2)) == (0, 3, 2)
    for recorded in ((0, 1), (0, 1, 4), (0, 0, 1), (0, 1, 2, 3), None):
        assert members(spec(), recorded) == (0, 1, 2)
