import itertools

import pytest

from waiting import poll_until, wait_until


def test_polling_returns_the_first_truthy_answer() -> None:
    answers = itertools.chain([0, "", None], itertools.repeat("ready"))
    assert poll_until(lambda: next(answers), timeout=5, interval=0) == "ready"


def test_polling_gives_the_last_answer_once_the_time_is_up() -> None:
    looks = itertools.count()
    assert poll_until(lambda: next(looks) < 0, timeout=0.05, interval=0.01) is False
    assert next(looks) >= 2  # it looked more than once


def test_waiting_fails_naming_what_it_waited_for() -> None:
    assert wait_until(lambda: 3, 1, "three") == 3
    with pytest.raises(AssertionError, match=r"timed out after 0.05s waiting for the sky to fall"):
        wait_until(lambda: None, 0.05, "the sky to fall", interval=0.01)
