"""is_retryable: which failures each restartPolicy retries."""

from __future__ import annotations

import pytest

from ddp_operator.failures import RankFailure
from ddp_operator.policy import is_retryable


def failure(exit_code: int | None = 1, evicted: bool = False) -> RankFailure:
    return RankFailure(0, "mnist-0", exit_code, "Error", evicted)


@pytest.mark.parametrize(
    ("policy", "exit_code", "evicted", "retryable"),
    [
        ("OnFailure", 1, False, True),
        ("OnFailure", 137, False, True),
        ("OnFailure", None, True, True),
        ("Never", 137, False, False),
        ("Never", None, True, False),
        ("ExitCode", 1, False, False),
        ("ExitCode", 127, False, False),
        ("ExitCode", 128, False, True),
        ("ExitCode", 137, False, True),
        ("ExitCode", 255, False, True),
        ("ExitCode", None, True, True),
        ("ExitCode", 1, True, True),
        ("ExitCode", None, False, True),
    ],
)
def test_is_retryable(policy: str, exit_code: int | None, evicted: bool, retryable: bool) -> None:
    assert is_retryable(policy, failure(exit_code, evicted)) is retryable
