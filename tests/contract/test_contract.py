"""The operator-rank contract: timestamps, exit codes, the backend rule, env names."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from ddp_contract import envnames
from ddp_contract.backend import resolve_backend
from ddp_contract.exitcodes import ExitCode, is_retryable_exit
from ddp_contract.targets import ENTRYPOINT_RE, SCRIPT_FUNCTION_RE
from ddp_contract.timestamps import parse_rfc3339, rfc3339

NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("2025-01-02T03:04:05Z", NOW), ("2025-01-02T03:04:05+00:00", NOW), (None, None), ("", None)],
)
def test_parse_rfc3339(value: str | None, expected: datetime | None) -> None:
    assert parse_rfc3339(value) == expected


def test_rfc3339_treats_naive_as_utc() -> None:
    assert rfc3339(NOW.replace(tzinfo=None)) == "2025-01-02T03:04:05Z"


def test_rfc3339_of_a_posix_time_with_milliseconds() -> None:
    assert rfc3339(NOW.timestamp() + 0.25, millis=True) == "2025-01-02T03:04:05.250Z"


@pytest.mark.parametrize(("code", "retryable"), [(1, False), (2, False), (127, False), (128, True), (137, True),
                                                (143, True), (200, True), (255, True)])
def test_exit_codes_1_to_127_are_permanent(code: int, retryable: bool) -> None:
    assert is_retryable_exit(code) is retryable


def test_the_runtimes_own_codes_fall_on_the_right_side() -> None:
    assert not ExitCode.USER_ERROR.retryable and not ExitCode.CONFIG_ERROR.retryable
    assert all(code.retryable for code in ExitCode if code >= 200)


@pytest.mark.parametrize(("requested", "gpu", "expected"), [("auto", True, "nccl"), ("auto", False, "gloo"),
                                                            ("gloo", True, "gloo"), ("nccl", False, "nccl")])
def test_backend_rule(requested: str, gpu: bool, expected: str) -> None:
    assert resolve_backend(requested, gpu) == expected


def test_reserved_env_is_the_rendezvous_and_job_identity() -> None:
    assert {envnames.RANK, envnames.WORLD_SIZE, envnames.MASTER_ADDR, envnames.ATTEMPT} <= envnames.RESERVED
    assert envnames.AWS_ACCESS_KEY_ID not in envnames.RESERVED and envnames.DATASET_URI not in envnames.RESERVED


def test_failure_line_round_trips_and_its_signature_ignores_the_rank() -> None:
    from ddp_contract.failureline import format_line, parse_line

    one = format_line(1, 120, 1, "USER_ERROR", False, "ZeroDivisionError: division\n by zero")
    other = format_line(3, 120, 1, "USER_ERROR", False, "ZeroDivisionError: division by zero")
    assert one == "ddp-trainer: error (rank 1, step 120, exit 1 USER_ERROR, permanent): ZeroDivisionError: division by zero"
    parsed = parse_line(f"Traceback ...\n  raise\n{one}\n")
    assert parsed is not None and (parsed.rank, parsed.step, parsed.exit_code) == (1, 120, 1)
    assert parsed.signature == parse_line(other).signature  # type: ignore[union-attr]
    assert parse_line(format_line(None, None, 2, "CONFIG_ERROR", False, "bad")).step is None  # type: ignore[union-attr]
    assert parse_line("Killed\n") is None and parse_line(None) is None
    later = parse_line(format_line(1, 121, 1, "USER_ERROR", False, "ZeroDivisionError: division by zero"))
    assert later is not None and later.signature != parsed.signature


def test_infrastructure_exits_are_the_runtimes_own_and_kills_from_outside() -> None:
    from ddp_contract.exitcodes import is_infrastructure_exit

    assert is_infrastructure_exit(ExitCode.HUNG) and is_infrastructure_exit(ExitCode.COMMUNICATION_ERROR)
    assert is_infrastructure_exit(143) and is_infrastructure_exit(137)
    assert not is_infrastructure_exit(137, oom_killed=True)  # the program used too much memory
    assert not any(is_infrastructure_exit(code) for code in (1, 2, 134, 139))


def test_what_a_rank_runs_entrypoints_and_functions_in_scripts() -> None:
    assert ENTRYPOINT_RE.match("pkg.train:main") and not ENTRYPOINT_RE.match("pkg.train")
    match = SCRIPT_FUNCTION_RE.match("/opt/ddp-client/code/train.py:train")
    assert match is not None and (match["script"], match["function"]) == ("/opt/ddp-client/code/train.py", "train")
    assert not SCRIPT_FUNCTION_RE.match("pkg.train:main") and not SCRIPT_FUNCTION_RE.match("train.py")
