"""A pass that raised: trying again may help (the API server's, the network's) or not (the job's own), and its words."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from kubernetes.client.rest import ApiException
from urllib3.exceptions import ProtocolError, ReadTimeoutError

from ddp_operator.passerrors import describe_error, failed_pass_message, is_transient


def raised(fn, *args):
    try:
        fn(*args)
    except Exception as error:  # noqa: BLE001 - the test keeps whatever it raised, traceback and all
        return error
    raise AssertionError("it did not raise")


def past_the_calendar() -> None:
    datetime(9999, 12, 31, tzinfo=UTC) + timedelta(days=1)


@pytest.mark.parametrize(("error", "transient"), [
    (ApiException(status=500), True),
    (ApiException(status=503), True),
    (ApiException(status=429), True),
    (ApiException(status=409), True),
    (ApiException(status=0), True),  # no answer at all
    (ProtocolError("Connection aborted."), True),
    (ReadTimeoutError(None, "/api", "timed out"), True),
    (ConnectionResetError(), True),
    (ApiException(status=422), False),
    (ApiException(status=403), False),
    (OverflowError("date value out of range"), False),
    (TypeError("'int' object is not iterable"), False),
    (KeyError("name"), False),
])
def test_only_the_api_server_s_and_the_network_s_errors_are_transient(error: Exception, transient: bool) -> None:
    assert is_transient(error) is transient


def test_an_error_is_described_with_the_operator_s_frame_it_left() -> None:
    from ddp_operator import deadlines  # a frame of the operator's own: its file and function are named

    error = raised(deadlines.left_of, 1.0, "not a date", datetime.now(UTC))
    assert re.fullmatch(r"TypeError: unsupported operand type\(s\) for -: .* \(deadlines\.py:\d+ in left_of\)",
                        describe_error(error)), describe_error(error)
    assert describe_error(raised(past_the_calendar)) == "OverflowError: date value out of range"  # no frame of ours


def test_an_error_without_words_is_named_by_its_type_and_the_api_server_s_by_its_answer() -> None:
    assert describe_error(ZeroDivisionError()) == "ZeroDivisionError"
    refused = ApiException(status=422, reason="Unprocessable Entity")
    refused.body = '{"message": "DDPJob.ddpoperator.io \\"x\\" is invalid: status.phase: Unsupported value"}'
    assert describe_error(refused) == 'ApiException: 422 DDPJob.ddpoperator.io "x" is invalid: status.phase: Unsupported value'


def test_the_message_says_the_pass_what_failed_and_what_to_do_and_is_the_same_each_time() -> None:
    first, again = (failed_pass_message(raised(past_the_calendar), "status pass") for _ in range(2))
    assert first == again
    assert first.startswith("the operator's status pass failed on this job: OverflowError: date value out of range")
    assert "tries again" in first and "DDPJob reference" in first
