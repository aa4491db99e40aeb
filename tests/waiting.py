"""Waiting for a condition in a test: polled, bounded, and named when it does not come."""

from __future__ import annotations

import time
from collections.abc import Callable


def poll_until(predicate: Callable[[], object], timeout: float, interval: float = 0.2) -> object:
    """Polls predicate until it returns something truthy, and returns that; after `timeout` seconds, its
    last (falsy) answer."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


def wait_until(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.2) -> object:
    """Polls predicate until it returns something truthy; fails naming what was awaited."""
    value = poll_until(predicate, timeout, interval)
    if not value:
        raise AssertionError(f"timed out after {timeout}s waiting for {what}")
    return value
