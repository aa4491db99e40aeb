"""Names a job needs that objects it does not control hold (the gang too large for the cluster is
judged in test_nodes.py, with the nodes it is judged against)."""

from __future__ import annotations

from ddp_operator.capacity import InTheWay
from ddp_operator.failures import describe_problems


def test_names_held_by_strangers_hold_up_the_ranks_that_need_them() -> None:
    nothing = InTheWay()
    assert not nothing and nothing.problems(3, []) == ()
    service = InTheWay(objects=("Service mnist",)).problems(3, live_indices=[0])
    assert [p.index for p in service] == [1, 2] and {p.reason for p in service} == {"NameInUse"}
    assert service[0].message.startswith("Service mnist exists and is not this job's; the operator never adopts")
    pod_held = InTheWay(pods=((1, "mnist-1"),))
    reason, message = describe_problems(pod_held.problems(3, [0, 2]))
    assert reason == "NameInUse" and message.startswith("rank 1 (NameInUse): pod mnist-1 exists and is not this job's")
