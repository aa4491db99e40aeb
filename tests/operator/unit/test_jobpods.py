"""A job's rank pods as a status pass reads them (jobpods.read_pods): what the summary adds from the
job's memory and the clock, here a scheduler of the pods' own that never answers."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from ddp_contract.timestamps import rfc3339
from ddp_operator import constants as c
from ddp_operator.jobmemory import JobMemory
from ddp_operator.jobpods import read_pods
from ddp_operator.nodes import Nodes
from ddp_operator.podstate import SCHEDULER_ANSWER_SECONDS, unanswered_for
from ddp_operator.podwatch import slim_pod
from podfixtures import JOB, NOW, job_spec, pod

SPEC = job_spec(worldSize=2)


def waiting_on(scheduler: str, index: int, waited: float, **conditions: str) -> dict[str, Any]:
    """A pending pod of the job, unbound, created `waited` seconds ago, naming `scheduler`."""
    found = pod(index, "pending")
    found["metadata"]["creationTimestamp"] = rfc3339(NOW - timedelta(seconds=waited))
    found["spec"]["schedulerName"] = scheduler
    found["status"]["conditions"] = [{"type": t, "status": s} for t, s in conditions.items()]
    return found


def read(*pods: dict[str, Any]) -> Any:
    return read_pods([slim_pod(p) for p in pods], spec=SPEC, status={}, job_name=JOB, generation=1, nodes=Nodes(),
                     memory=JobMemory(), deleting=set(), now=NOW)


def test_only_a_scheduler_of_the_pod_s_own_that_has_said_nothing_is_waited_on() -> None:
    assert unanswered_for(waiting_on("volcano", 0, 12.0), NOW) == 12.0
    assert unanswered_for(waiting_on("default-scheduler", 0, 12.0), NOW) is None
    assert unanswered_for(waiting_on("volcano", 0, 12.0, PodScheduled="False"), NOW) is None  # it answered
    bound = waiting_on("volcano", 0, 12.0)
    bound["spec"]["nodeName"] = "n1"
    assert unanswered_for(bound, NOW) is None
    assert unanswered_for(pod(0, "running"), NOW) is None


def test_a_scheduler_that_never_answers_holds_the_ranks_up_after_a_while_and_the_pass_looks_again_then() -> None:
    early = read(waiting_on("a-scheduler", 0, 10.0), waiting_on("a-scheduler", 1, 20.0))
    assert early.problems == () and early.scheduler_due == SCHEDULER_ANSWER_SECONDS - 20.0
    late = read(waiting_on("a-scheduler", 0, 10.0), waiting_on("a-scheduler", 1, 45.0))
    assert [(p.index, p.reason) for p in late.problems] == [(1, c.REASON_NOT_SCHEDULED)]
    assert "schedulerName 'a-scheduler' names a scheduler that has not answered" in late.problems[0].message
    assert late.scheduler_due == SCHEDULER_ANSWER_SECONDS - 10.0
    assert read(pod(0), pod(1)).scheduler_due is None
