"""Two operator replicas on one Lease: only the holder acts; killing it hands over within the lease's time,
with no pod created twice; a replica stopping on purpose releases the Lease at once.

Short lease times (the chart's are 15/10/2 s) keep the tests quick; the session's operator is stopped
meanwhile, so the only operators acting on these jobs are the two replicas.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from kubernetes import client

from ddp_operator import constants as c
from ddp_operator.config import (
    ENV_IDENTITY,
    ENV_LEASE_DURATION,
    ENV_LEASE_NAME,
    ENV_LEASE_NAMESPACE,
    ENV_LEASE_RENEW_DEADLINE,
    ENV_LEASE_RETRY_PERIOD,
    ENV_NAMESPACES,
    LeaseConfig,
)
from ddp_operator.leader import LeaderElector
from kube import Cluster, Jobs, OperatorProcess, PodLives, another_operator_acts, wait_until

pytestmark = pytest.mark.alone("times a lease's hand-over in seconds")

P = "ddp_operator_"
LEASE_DURATION = 6.0
RETRY_PERIOD = 1.0
# A standby takes over once the lease has gone unrenewed for its duration, counted from the last
# renewal it saw (it looks every retry period); the rest is a loaded machine's slack.
HAND_OVER_WITHIN = LEASE_DURATION + 2 * RETRY_PERIOD + 4


@pytest.fixture
def replicas(cluster: Cluster, crd: None, kube_api, namespace: str, operator: OperatorProcess,
             tmp_path: Path) -> Iterator[tuple[OperatorProcess, OperatorProcess]]:
    operator.stop()  # the session's operator would act on these jobs too
    if another_operator_acts(kube_api, namespace):
        operator.restart()
        pytest.skip("another test session's operator serves every namespace of this cluster: it would act too")
    settings = {ENV_NAMESPACES: namespace, ENV_LEASE_NAME: "ddp-operator", ENV_LEASE_NAMESPACE: namespace,
                ENV_LEASE_DURATION: str(LEASE_DURATION), ENV_LEASE_RENEW_DEADLINE: "4",
                ENV_LEASE_RETRY_PERIOD: str(RETRY_PERIOD)}
    first, second = (OperatorProcess(cluster.kubeconfig, tmp_path / f"{name}.log", env={**settings, ENV_IDENTITY: name})
                     for name in ("first", "second"))
    try:
        first.start()
        second.start(until=OperatorProcess.STANDBY)
        yield first, second
    finally:
        for replica in (first, second):
            replica.stop()
        operator.restart()
    for replica in (first, second):
        log = replica.log_path.read_text()
        assert "Traceback" not in log, log[-5000:]


def holder(kube_api, namespace: str) -> str:
    return client.CoordinationV1Api(kube_api).read_namespaced_lease("ddp-operator", namespace).spec.holder_identity


def test_only_the_leader_acts_and_a_killed_leader_hands_over_within_the_lease(
        kube_api, namespace: str, replicas: tuple[OperatorProcess, OperatorProcess]) -> None:
    first, second = replicas
    jobs = Jobs(kube_api, namespace)
    assert holder(kube_api, namespace) == "first"
    assert (first.metric(P + "leader"), second.metric(P + "leader")) == (1, 0)

    with PodLives(jobs, "ha") as lives:
        jobs.create("ha", worldSize=4, backoffLimit=3)
        jobs.wait_phase("ha", c.PHASE_RUNNING)
        # The standby has not even looked at the job.
        assert second.metric(P + "pods_created_total") == 0
        assert sum(v for (name, _), v in second.metrics().items() if name == P + "jobs") == 0
        assert "ddp-operator started" not in second.log_path.read_text()

        # A rank fails, and the leader dies while it may be in the middle of the gang restart.
        jobs.finish("ha-2", 137, "OOMKilled")
        first.kill()
        killed = time.monotonic()
        wait_until(lambda: second.metric(P + "leader") == 1, HAND_OVER_WITHIN + 2, "the standby to lead")
        hand_over = time.monotonic() - killed
        print(f"hand-over after SIGKILL: {hand_over:.1f} s (lease {LEASE_DURATION:.0f} s)")
        assert hand_over <= HAND_OVER_WITHIN
        assert holder(kube_api, namespace) == "second"

        jobs.wait_pods("ha", 4, attempt=1, timeout=60)
        status = jobs.wait_phase("ha", c.PHASE_RUNNING, timeout=60)
        assert status["attempt"] == 1 and status["restarts"] == 1
        # Each rank's pod created once per attempt, by whichever replica led; none of the new gang deleted.
        assert lives.created() == {"0": 4, "1": 4}
        assert lives.deleted_of(1) == 0


def test_a_leader_stopped_on_purpose_releases_the_lease_at_once(
        kube_api, namespace: str, replicas: tuple[OperatorProcess, OperatorProcess]) -> None:
    first, second = replicas
    jobs = Jobs(kube_api, namespace)
    jobs.create("calm", worldSize=2)
    jobs.wait_phase("calm", c.PHASE_RUNNING)

    stopping = time.monotonic()
    first.stop()  # SIGTERM: kopf's cleanup stops the reconciler, then the Lease is released
    wait_until(lambda: second.metric(P + "leader") == 1, LEASE_DURATION, "the standby to lead")
    hand_over = time.monotonic() - stopping
    print(f"hand-over after SIGTERM: {hand_over:.1f} s")
    assert "released lease" in first.log_path.read_text()
    # The new leader serves the job: a failure restarts the gang.
    jobs.finish("calm-0", 1)
    jobs.wait_pods("calm", 2, attempt=1)
    assert jobs.wait_phase("calm", c.PHASE_RUNNING)["restarts"] == 1
    assert second.metric(P + "gang_restarts_total", reason=c.REASON_RANK_FAILED, kind=c.KIND_PROGRAM) == 1


def test_a_lease_whose_times_fall_on_a_whole_second_is_renewed_and_released(kube_api, namespace: str) -> None:
    # The client reads MicroTimes as datetimes, which print without a fraction on a whole second; the
    # API server refuses that form, so the elector must write back the times it read as they were.
    whole = "2026-11-24T21:45:13.000000Z"
    leases = client.CoordinationV1Api(kube_api)
    leases.create_namespaced_lease(namespace, {
        "metadata": {"name": "ddp-operator"},
        "spec": {"holderIdentity": "me", "leaseDurationSeconds": 6, "acquireTime": whole, "renewTime": whole}})
    config = LeaseConfig("ddp-operator", namespace, "me", duration=6, renew_deadline=4, retry_period=1)
    elector = LeaderElector(kube_api, config, on_lost=lambda: None)

    assert elector.step() and elector.leading.is_set()
    renewed = leases.read_namespaced_lease("ddp-operator", namespace).spec
    assert renewed.holder_identity == "me" and renewed.acquire_time == datetime(2026, 11, 24, 21, 45, 13, tzinfo=UTC)
    elector.stop()
    assert holder(kube_api, namespace) is None
