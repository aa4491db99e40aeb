"""Numbers from environment variables: one parser and one set of messages for the operator and the ranks."""

from __future__ import annotations

import pytest

from ddp_contract.envnumbers import EnvNumberError, env_number


def test_unset_or_empty_is_the_default_and_a_value_is_parsed_as_its_kind() -> None:
    assert env_number("X", None, int, 7) == 7 and env_number("X", "", float, 2.5) == 2.5
    assert env_number("X", "12", int, 7) == 12 and type(env_number("X", "12", float, 7.0)) is float
    assert env_number("X", " 3 ", int, 0) == 3  # as int() reads it; callers strip where they mean to


@pytest.mark.parametrize(
    ("raw", "kind", "bounds", "message"),
    [
        ("x", int, {}, "environment variable X='x' is not an integer"),
        ("1.5", int, {}, "environment variable X='1.5' is not an integer"),
        ("soon", float, {}, "environment variable X='soon' is not a number"),
        ("-1", int, {}, "environment variable X=-1 must be >= 0"),
        ("4095", int, {"minimum": 4096}, "environment variable X=4095 must be >= 4096"),
        ("-1", float, {}, r"environment variable X=-1.0 must be >= 0"),
        ("0", float, {"exclusive": True}, r"environment variable X=0.0 must be > 0"),
        ("70000", int, {"maximum": 65535}, "environment variable X=70000 must be <= 65535"),
    ],
)
def test_a_value_that_is_no_number_or_out_of_range_is_refused_naming_it(raw: str, kind: type, bounds: dict,
                                                                         message: str) -> None:
    with pytest.raises(EnvNumberError, match=f"^{message}$"):
        env_number("X", raw, kind, kind(0), **bounds)


def test_the_bounds_themselves_are_allowed_but_an_exclusive_minimum() -> None:
    assert env_number("X", "0", float, 1.0) == 0.0 and env_number("X", "65535", int, 1, maximum=65535) == 65535
    assert env_number("X", "1", int, 2, minimum=1) == 1 and env_number("X", "0.5", float, 1.0, exclusive=True) == 0.5
