"""Numbers read from environment variables, parsed and range-checked the same way on both sides: a
rank's settings (ddp_trainer.env) and the operator's (ddp_operator.config). Each side turns the
error into its own (the message names the variable and its value)."""

from __future__ import annotations

from typing import TypeVar

N = TypeVar("N", int, float)


class EnvNumberError(ValueError):
    """A variable that holds no number of the kind asked for, or one out of its range."""


def env_number(name: str, raw: str | None, kind: type[N], default: N, *, minimum: int = 0, exclusive: bool = False,
               maximum: float | None = None) -> N:
    """`raw`, the value of variable `name` as the caller read it (None or empty: `default`), as an int or
    a float no smaller than `minimum` (with `exclusive`, larger) and, given one, no larger than `maximum`."""
    if not raw:
        return default
    try:
        value = kind(raw)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise EnvNumberError(f"environment variable {name}={raw!r} is not {what}") from None
    if value < minimum or (exclusive and value == minimum):
        raise EnvNumberError(f"environment variable {name}={value} must be {'>' if exclusive else '>='} {minimum}")
    if maximum is not None and value > maximum:
        raise EnvNumberError(f"environment variable {name}={value} must be <= {maximum}")
    return value
