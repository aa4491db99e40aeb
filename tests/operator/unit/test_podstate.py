"""One pod read (podstate.PodView) and which pods an attempt's window holds (gangpods.AttemptWindow)."""

from __future__ import annotations

from ddp_contract import labels
from ddp_operator.gangpods import AttemptWindow
from ddp_operator.podstate import PodView
from podfixtures import JOB, pod


def test_a_pod_is_read_for_its_index_attempt_node_state_and_deletion() -> None:
    view = PodView.of(pod(3, "failed", attempt=2, node="gpu-1", deleting=True))
    assert (view.name, view.uid, view.job, view.index, view.attempt) == (f"{JOB}-3", "uid-3-2", JOB, 3, 2)
    assert (view.node, view.state, view.deleting, view.active) == ("gpu-1", "failed", True, False)
    pending = PodView.of(pod(0, "pending"))
    assert (pending.node, pending.state, pending.deleting, pending.active) == ("", "pending", False, True)


def test_a_pod_without_our_labels_has_no_index_or_attempt() -> None:
    stray = PodView.of({"metadata": {"name": "x", "labels": {labels.LABEL_RANK: "one"}}, "status": {"phase": "Running"}})
    assert (stray.index, stray.attempt, stray.job, stray.state) == (None, None, "", "running")


def test_the_window_holds_the_attempts_from_since_up_to_the_current_one_less_the_replaced() -> None:
    window = AttemptWindow.of(3, since=1, replaced={"uid-2-2"})
    held = {a: window.holds(PodView.of(pod(0, attempt=a))) for a in range(5)}
    assert held == {0: False, 1: True, 2: True, 3: True, 4: False}
    assert not window.holds(PodView.of(pod(2, attempt=2))), "a pod whose delete was issued is old"
    assert AttemptWindow.of(3, since=7).since == 3, "never past the current attempt"
    recreate = AttemptWindow.of(3)
    assert [recreate.holds(PodView.of(pod(0, attempt=a))) for a in (2, 3)] == [False, True]
