"""When a status pass looks at a job again (timers.py): the nearest of the waits what it found starts."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from ddp_contract.resource import JobStatus
from ddp_contract.timestamps import rfc3339
from ddp_operator import constants as c
from ddp_operator import timers
from ddp_operator.admission import Refusal, refused
from ddp_operator.nodes import Nodes, node_info
from ddp_operator.timers import Found, counts_wait, look_again, quota_wait
from podfixtures import NOW, api_node, job_spec

SPEC = job_spec()
QUIET = Found(SPEC, JobStatus.of({"phase": c.PHASE_RUNNING}), NOW, Nodes())
QUOTA = Refusal(c.REASON_QUOTA_EXCEEDED, "exceeded quota: team")


def test_a_pass_that_found_nothing_to_wait_for_leaves_the_job_to_the_watches() -> None:
    assert look_again(QUIET) is None


def test_what_no_watch_reports_is_looked_at_again_after_its_own_interval() -> None:
    assert look_again(replace(QUIET, in_the_way=True)) == timers.IN_THE_WAY_RECHECK
    assert look_again(replace(QUIET, data_workers_refused=True)) == timers.DATA_WORKERS_REFUSED_RECHECK
    assert look_again(replace(QUIET, in_the_way=True, data_workers_refused=True)) == timers.IN_THE_WAY_RECHECK
    assert look_again(replace(QUIET, workload_retry=0.0)) == 0.0, "a wait of nothing is a wait, not none"
    assert look_again(replace(QUIET, scheduler_due=12.5)) == 12.5


def test_the_nearest_wait_wins() -> None:
    found = replace(QUIET, in_the_way=True, decided=3.0, counts_held=0.4, quota_held=2.0, workload_retry=7.0)
    assert look_again(found) == pytest.approx(0.4)
    assert look_again(replace(found, counts_held=None)) == pytest.approx(2.0)
    assert look_again(replace(found, counts_held=None, quota_held=None)) == pytest.approx(3.0)
    assert look_again(replace(found, counts_held=None, quota_held=None, decided=None)) == timers.IN_THE_WAY_RECHECK


def test_the_deadlines_of_the_status_the_pass_leaves_fall_due() -> None:
    started = JobStatus.of({"phase": c.PHASE_RUNNING, "startTime": rfc3339(NOW - timedelta(seconds=40))})
    found = replace(QUIET, spec=job_spec(activeDeadlineSeconds=100), status=started)
    assert look_again(found) == pytest.approx(60)
    assert look_again(replace(found, decided=10.0)) == pytest.approx(10)


def test_a_node_not_ready_under_a_pod_is_looked_at_again_when_its_grace_runs_out() -> None:
    since = NOW - timedelta(seconds=30)
    nodes = Nodes({info.name: info for info in (node_info(api_node("gpu-0", "False", since, reason="KubeletNotReady")),
                                                node_info(api_node("gpu-1")))}, {}, True)
    assert look_again(replace(QUIET, nodes=nodes, bound=frozenset({"gpu-0", "gpu-1"}))) == pytest.approx(
        SPEC.node_lost_grace_seconds - 30)
    assert look_again(replace(QUIET, nodes=nodes, bound=frozenset({"gpu-1"}))) is None, "no pod on the NotReady node"


def test_a_patch_of_rank_counts_alone_is_held_back_for_the_rest_of_the_interval() -> None:
    starting = {"phase": c.PHASE_STARTING, "readyRanks": 1, "ready": "1/3", "message": "1/3 ranks ready"}
    counts = {**starting, "readyRanks": 2, "ready": "2/3", "message": "2/3 ranks ready"}
    assert counts_wait(starting, counts, 0.25) == pytest.approx(timers.COUNTS_INTERVAL - 0.25)
    assert counts_wait(starting, counts, timers.COUNTS_INTERVAL) is None, "the interval has passed: patch now"
    assert counts_wait(starting, {**counts, "phase": c.PHASE_RUNNING}, 0.25) is None, "a new phase never waits"


def test_counts_that_keep_moving_are_patched_less_and_less_often_up_to_half_a_minute_apart() -> None:
    starting = {"phase": c.PHASE_STARTING, "readyRanks": 1, "ready": "1/9999", "message": "1/9999 ranks ready"}
    counts = {**starting, "readyRanks": 2, "ready": "2/9999", "message": "2/9999 ranks ready"}
    assert timers.counts_interval(0) == timers.counts_interval(3) == timers.COUNTS_INTERVAL
    assert timers.counts_interval(40) == pytest.approx(10)
    assert timers.counts_interval(600) == timers.COUNTS_INTERVAL_MAX
    assert counts_wait(starting, counts, 2.0, counting_for=40) == pytest.approx(8)
    assert counts_wait(starting, counts, 10.0, counting_for=40) is None
    # A gang of 10,000 pods coming up evenly over 260 s: some twenty count-only patches, not 260.
    patches, last, t = 0, 0.0, 0.0
    while t < 260:
        t += 0.1
        if counts_wait(starting, counts, t - last, counting_for=t) is None:
            patches, last = patches + 1, t
    assert 10 <= patches <= 30, patches


def test_a_gang_a_quota_refused_is_tried_again_at_its_retry_time_for_its_attempt_only() -> None:
    said = refused(1, (0, 1), refusal=QUOTA, now=100.0)
    assert quota_wait(said, 1, 101.0) == pytest.approx(said.retry_at - 101.0)
    assert quota_wait(said, 1, said.retry_at) is None, "its time has come: try now"
    assert quota_wait(said, 2, 101.0) is None, "a refusal of another attempt holds nothing back"
    assert quota_wait(None, 1, 101.0) is None
    forbidden = refused(1, (0, 1), refusal=Refusal(c.REASON_POD_SECURITY, "violates PodSecurity"), now=100.0)
    assert quota_wait(forbidden, 1, 101.0) is None, "waiting cannot help a refusal that no quota freeing up lifts"
