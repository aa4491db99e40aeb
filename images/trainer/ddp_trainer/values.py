"""Plain Python values out of what training code hands the runtime (tensors, numpy scalars)."""

from __future__ import annotations

from typing import Any


def to_number(value: Any) -> Any:
    """A one-element tensor or a numpy scalar as a plain number (JSON can hold it); anything else as it is."""
    item = getattr(value, "item", None)
    if value is None or not callable(item):
        return value
    try:
        return item()
    except (ValueError, RuntimeError):  # more than one element: not a number
        return value
