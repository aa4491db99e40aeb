"""The restart mode as one object (modes/mode.py): picked once from the spec, it answers what the rest of
the operator asks of the mode, each mode its own way, on the same pods and status."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest

from ddp_contract import api
from ddp_contract.jobstatus import STATUS_CHECKPOINT_REQUESTED, STATUS_MEMBERS
from ddp_contract.resource import JobStatus
from ddp_contract.timestamps import rfc3339
from ddp_operator import constants as c
from ddp_operator import modes
from ddp_operator.modes.elastic import CheckpointRequest
from ddp_operator.podsummary import summarize_pods
from podfixtures import JOB, NOW, job_spec, pod

OPERATOR = Path(__file__).resolve().parents[3] / "operator" / "ddp_operator"
RECREATE = job_spec(worldSize=4)
IN_PLACE = job_spec(worldSize=4, restartStrategy=api.RESTART_IN_PLACE)
ELASTIC = job_spec(worldSize=4, minWorldSize=2, restartStrategy=api.RESTART_IN_PLACE)


def test_the_mode_is_picked_from_the_spec() -> None:
    assert type(modes.of(RECREATE)) is modes.Recreate
    assert type(modes.of(IN_PLACE)) is modes.InPlace
    assert type(modes.of(ELASTIC)) is modes.Elastic
    full = job_spec(worldSize=4, minWorldSize=4, restartStrategy=api.RESTART_IN_PLACE)
    assert type(modes.of(full)) is modes.InPlace, "a minimum of the whole world size is no elastic job"
    assert modes.of(ELASTIC).spec is ELASTIC


def test_a_restart_replaces_every_pod_under_recreate_and_only_those_that_cannot_go_on_in_place() -> None:
    summary = summarize_pods([pod(0), pod(1, "failed"), pod(2, "succeeded"), pod(3, attempt=1)], 1, job_name=JOB, since=0)
    running, anyway = summary.running_pods, summary.replaced_anyway
    every = tuple(f"{JOB}-{i}" for i in range(4))
    assert modes.of(RECREATE).replaced_by_restart(summary, running=running, anyway=anyway) == every
    kept = (f"{JOB}-1", f"{JOB}-2")  # the finished ones; rank 0 and 3 run on
    assert modes.of(IN_PLACE).replaced_by_restart(summary, running=running, anyway=anyway) == kept
    assert modes.of(ELASTIC).replaced_by_restart(summary, running=running, anyway=anyway) == kept
    assert [modes.of(s).restarting for s in (RECREATE, IN_PLACE, ELASTIC)] == ["the gang", "in place", "in place"]


def test_only_a_recreate_restart_moves_the_recreated_attempt() -> None:
    assert [modes.of(s).restart_recreates for s in (RECREATE, IN_PLACE, ELASTIC)] == [True, False, False]


def test_a_restarted_gang_regroups_before_running_only_in_place() -> None:
    restarting = JobStatus.of({"phase": c.PHASE_RESTARTING, "attempt": 2, "rendezvous": {"attempt": 1}})
    formed = JobStatus.of({"phase": c.PHASE_RESTARTING, "attempt": 2, "rendezvous": {"attempt": 2}})
    running = JobStatus.of({"phase": c.PHASE_RUNNING, "attempt": 2, "rendezvous": {"attempt": 1}})
    assert [modes.of(s).regrouping(restarting) for s in (RECREATE, IN_PLACE, ELASTIC)] == [False, True, True]
    assert not modes.of(IN_PLACE).regrouping(formed) and not modes.of(IN_PLACE).regrouping(running)


def test_the_window_leaves_out_pods_being_deleted_only_where_it_spans_attempts() -> None:
    deleting = {"uid-1-0", "uid-2-0"}
    assert modes.of(RECREATE).left_out_of_window(deleting) == frozenset()
    assert modes.of(IN_PLACE).left_out_of_window(deleting) == deleting == modes.of(ELASTIC).left_out_of_window(deleting)


def test_only_an_elastic_job_has_members_of_its_own() -> None:
    recorded = JobStatus.of({STATUS_MEMBERS: [2, 0]})
    assert modes.of(RECREATE).members(recorded) is None and modes.of(IN_PLACE).members(recorded) is None
    assert modes.of(ELASTIC).members(recorded) == (0, 2)
    assert modes.of(ELASTIC).members(JobStatus.of({})) == (0, 1, 2, 3)


def test_only_an_elastic_job_records_members_and_a_checkpoint_request() -> None:
    asked = CheckpointRequest(rfc3339(NOW), 40)
    assert modes.of(RECREATE).membership_status((0, 1), asked) == {} == modes.of(IN_PLACE).membership_status((0, 1), asked)
    assert modes.of(ELASTIC).membership_status((0, 1), asked) == {
        STATUS_MEMBERS: [0, 1], STATUS_CHECKPOINT_REQUESTED: {"since": rfc3339(NOW), "afterStep": 40}}
    assert modes.of(ELASTIC).membership_status((0, 1, 2), None) == {STATUS_MEMBERS: [0, 1, 2],
                                                                      STATUS_CHECKPOINT_REQUESTED: None}


def test_only_an_elastic_gang_may_be_created_and_start_in_part() -> None:
    assert modes.of(RECREATE).least_created is None and modes.of(IN_PLACE).least_created is None
    assert modes.of(ELASTIC).least_created == 2
    assert [modes.of(ELASTIC).part_may_start(n) for n in (1, 2, 3)] == [False, True, True]
    assert not modes.of(RECREATE).part_may_start(3) and not modes.of(IN_PLACE).part_may_start(3)


def test_a_failed_job_waits_for_a_pod_that_failed_in_place_only_in_place() -> None:
    failed = JobStatus.of({"phase": c.PHASE_FAILED, "completionTime": rfc3339(NOW - timedelta(seconds=10))})
    assert modes.of(RECREATE).exit_grace_left(failed, NOW) is None
    assert modes.of(IN_PLACE).exit_grace_left(failed, NOW) == pytest.approx(20)
    assert modes.of(ELASTIC).exit_grace_left(failed, NOW) == pytest.approx(20)


def test_only_a_gang_kept_in_place_has_a_deadline_to_form_again() -> None:
    since = rfc3339(NOW - timedelta(seconds=30))
    status = JobStatus.of({"phase": c.PHASE_RESTARTING, "attempt": 1, "attemptTime": since})
    pods = [pod(0, attempt=0), pod(1, attempt=1), pod(2, attempt=0), pod(3, attempt=0)]  # rank 1's replaced
    summary = summarize_pods(pods, 1, job_name=JOB, since=0)
    asked = {"status": status, "pods": summary, "kept": summary.kept, "now": NOW}
    assert modes.of(RECREATE).deadline_left(**asked) is None
    assert modes.of(IN_PLACE).deadline_left(**asked) == pytest.approx(IN_PLACE.in_place_deadline_seconds - 30)
    assert modes.of(ELASTIC).deadline_left(**asked) == pytest.approx(ELASTIC.in_place_deadline_seconds - 30)


def test_only_an_elastic_gang_resizes_and_takes_running_pods_in_on_a_restart() -> None:
    status = JobStatus.of({"phase": c.PHASE_RESTARTING, "attempt": 1, STATUS_MEMBERS: [0, 1], "rendezvous": {"attempt": 0},
                           "startTime": rfc3339(NOW - timedelta(minutes=5))})
    summary = summarize_pods([pod(0), pod(1), pod(2), pod(3)], 1, job_name=JOB, since=0, members=(0, 1))
    for plain in (RECREATE, IN_PLACE):
        assert modes.of(plain).resize(status=status, pods=summary, waiting=summary.waiting, now=NOW) is None
        assert modes.of(plain).restart_members(summary, summary.waiting) is None
    grown = modes.of(ELASTIC).resize(status=status, pods=summary, waiting=summary.waiting, now=NOW)
    assert grown is not None and grown.due and grown.members == (0, 1, 2, 3)
    assert modes.of(ELASTIC).restart_members(summary, summary.waiting) == (0, 1, 2, 3)


def test_no_module_outside_modes_asks_the_spec_for_its_restart_mode() -> None:
    """Only modes.of reads which mode a job has; manifests.py tells the pod's runtime (and sits below
    the modes: elastic.py names pods through it)."""
    asking = sorted(str(path.relative_to(OPERATOR)) for path in OPERATOR.rglob("*.py")
                    if path.parent.name != "modes" and re.search(r"\bspec\.(in_place|elastic)\b", path.read_text()))
    assert asking == ["manifests.py"]
