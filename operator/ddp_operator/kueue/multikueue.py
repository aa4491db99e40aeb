"""Who runs a DDPJob, by its spec.managedBy, and what the operator does for one MultiKueue runs.

Kueue's MultiKueue (its generic adapter for custom kinds) spreads jobs over clusters: on the manager
cluster a job says spec.managedBy: kueue.x-k8s.io/multikueue and names a LocalQueue. The operator there
creates the job's Workload, as for any queued job, and says on the job that it waits in its queue; once the
manager's Kueue admits the Workload, MultiKueue has created a copy of the job on the worker cluster it
picked (without managedBy, with the Workload it made there beforehand named in an annotation: rules.py) and
copies that copy's whole status to the job here, so the operator here writes no more status and makes no
pods. It still keeps the Workload: deactivated while the job is suspended, its quota handed back when
Kueue evicts it (there are no pods to wait for). On the worker the operator runs the copy like any job.

Pure: the caller (reconciler.py) carries it out.
"""

from __future__ import annotations

import enum

from ddp_contract import api
from ddp_operator import constants as c
from ddp_operator.kueue.rules import QUEUE_LABEL, Gate, QueueState


class Role(enum.Enum):
    RUN = "run"  # the operator runs the job: its pods, its status
    QUEUE = "queue"  # MultiKueue's, not dispatched yet: the operator keeps its Workload and says it waits
    DISPATCHED = "dispatched"  # MultiKueue's, running on a worker: the Workload only; status is MultiKueue's
    ELSEWHERE = "elsewhere"  # another controller's: left alone


def role(managed_by: str, queue: QueueState | None, phase: str | None) -> Role:
    """What the operator does for a job of spec.managedBy `managed_by`, whose Workload allows `queue`
    (KueueGate.state: None for a finished job) and whose status says `phase`."""
    if managed_by == api.MANAGED_BY_OPERATOR:
        return Role.RUN
    if managed_by != api.MANAGED_BY_MULTIKUEUE:
        return Role.ELSEWHERE
    if phase in c.TERMINAL_PHASES or queue is None or queue.gate in (Gate.ADMITTED, Gate.EVICTED):
        return Role.DISPATCHED
    return Role.QUEUE


NEEDS_A_QUEUE = QueueState(
    Gate.QUEUED, c.REASON_QUEUED,
    f"spec.managedBy is {api.MANAGED_BY_MULTIKUEUE} but the job names no LocalQueue: MultiKueue dispatches "
    f"jobs that Kueue admits; label the job {QUEUE_LABEL}=<a LocalQueue whose ClusterQueue has a MultiKueue "
    "admission check>")
