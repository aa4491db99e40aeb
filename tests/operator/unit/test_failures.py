"""How held-up and failed ranks are said: grouped by cause, ranks as spans."""

from __future__ import annotations

import pytest

from ddp_operator.failures import PodProblem, describe_problems, rank_list

NO_GPU = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu. preemption: not helpful for scheduling."


def test_problems_are_grouped_by_cause_and_the_commonest_names_the_reason() -> None:
    problems = [PodProblem(r, "Unschedulable", NO_GPU) for r in (0, 1, 2, 3, 6)]
    problems.append(PodProblem(5, "ImagePullError", "Back-off"))
    reason, message = describe_problems(problems)
    assert reason == "Unschedulable"
    assert message == f"ranks 0-3, 6 (Unschedulable): {NO_GPU}; rank 5 (ImagePullError): Back-off"
    assert describe_problems([]) == ("", "")


@pytest.mark.parametrize(("ranks", "text"),
                         [([3], "rank 3"), ([0, 1, 2], "ranks 0-2"), ([5, 0, 1, 9, 8], "ranks 0-1, 5, 8-9")])
def test_rank_list(ranks: list[int], text: str) -> None:
    assert rank_list(ranks) == text
