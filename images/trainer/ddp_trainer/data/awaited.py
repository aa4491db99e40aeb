"""What a rank's main thread is waiting on outside torch: a data worker's batch. The hang watch names
it when the rank's step stops advancing, so a hang the data path causes says where it is stuck."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_waits: dict[int, tuple[str, float]] = {}  # thread id -> (what, since: monotonic time)


@contextmanager
def waiting_on(what: str) -> Iterator[None]:
    """While the block runs, the calling thread waits on `what` (e.g. "data worker x:29600 for batch 17")."""
    ident = threading.get_ident()
    with _lock:
        _waits[ident] = (what, time.monotonic())
    try:
        yield
    finally:
        with _lock:
            _waits.pop(ident, None)


def describe(now: float | None = None) -> str:
    """"waiting on <what> for <n>s" for each wait in progress, longest first; empty when none is."""
    now = time.monotonic() if now is None else now
    with _lock:
        waits = sorted(_waits.values(), key=lambda wait: wait[1])
    return "; ".join(f"waiting on {what} for {now - since:.0f}s" for what, since in waits)
