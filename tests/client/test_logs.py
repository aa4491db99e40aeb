"""Merging ranks' output: prefixes, the failed rank first, and following new lines only."""

from __future__ import annotations

from ddp_client.logs import Follower, failed_rank, merge, prefix_lines, rank_order


def test_every_line_gets_its_rank_and_a_last_line_without_newline_gets_one() -> None:
    assert prefix_lines(3, "a\nb") == "[rank 3] a\n[rank 3] b\n"
    assert prefix_lines(0, "") == ""


def test_the_failed_rank_comes_first_then_the_others_in_order() -> None:
    assert rank_order([2, 0, 1], failed=1) == [1, 0, 2]
    assert rank_order([2, 0], failed=5) == [0, 2]  # not among them: plain order
    assert merge({0: "zero\n", 1: "one\nboom\n"}, failed=1) == "[rank 1] one\n[rank 1] boom\n[rank 0] zero\n"


def test_the_failed_rank_is_the_one_whose_failure_ended_that_attempt() -> None:
    status = {"failedRank": {"rank": 3, "attempt": 2}}
    assert failed_rank(status, 2) == 3 and failed_rank(status, 1) is None
    assert failed_rank({"failedRank": {"rank": 0}}, 5) == 0  # no attempt recorded: any
    assert failed_rank({}, 0) is None


def test_following_returns_only_complete_new_lines_and_the_rest_at_the_end() -> None:
    follower = Follower()
    assert follower.new_lines({0: "a\nb", 1: "x\n"}) == "[rank 0] a\n[rank 1] x\n"
    assert follower.new_lines({0: "a\nb", 1: "x\n"}) == ""  # "b" is still being written
    assert follower.new_lines({0: "a\nbc\nd", 1: "x\ny\n"}) == "[rank 0] bc\n[rank 1] y\n"
    assert follower.new_lines({0: "a\nbc\nde", 1: "x\ny\n"}, final=True) == "[rank 0] de\n"
    assert follower.new_lines({0: "new\n"}) == "[rank 0] new\n"  # shorter: a new attempt's output
