"""Writes to S3 that outlive an outage: a thread writes the newest value handed to it, and while S3 cannot
be reached (StorageUnavailableError) keeps it and tries again every few seconds, so that training goes on.

A value handed while another waits replaces it: a checkpoint of a later step, or a longer metrics part,
makes the older one worth nothing. Past the outage limit ($DDP_S3_OUTAGE_SECONDS) the error is raised
to the code that hands or waits next, and the rank exits 203 (StorageUnavailable) as at any S3 outage.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from ..errors import StorageUnavailableError

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

FIRST_RETRY_SECONDS = 1.0
MAX_RETRY_SECONDS = 30.0
PROBE_EVERY_SECONDS = 2.0  # while room() waits for a write, how often it asks whether S3 answers


def retry_delay(failures: int) -> float:
    """Seconds before the next try after `failures` (>= 1) in a row: 1, 2, 4, ... up to 30."""
    return min(MAX_RETRY_SECONDS, FIRST_RETRY_SECONDS * 2 ** (failures - 1))


@dataclass(frozen=True)
class Behind(Generic[T]):
    """What waits for S3 (the newest value handed), since when S3 fails (time.time()) and its last error."""

    value: T
    since: float
    error: str


@dataclass
class Outage:
    """An S3 outage as one writer sees it: since when its writes fail, and whether that is past `limit_s`."""

    limit_s: float
    since: float | None = None  # time.time() of the first failed write
    since_monotonic: float = 0.0
    failures: int = 0

    @property
    def ongoing(self) -> bool:
        return self.since is not None

    def failed(self, now: float, now_monotonic: float) -> bool:
        """Counts a write that could not reach S3; True while the outage is within the limit (never with 0)."""
        if self.since is None:
            self.since, self.since_monotonic = now, now_monotonic
        self.failures += 1
        return self.limit_s > 0 and now_monotonic - self.since_monotonic <= self.limit_s

    def ended(self) -> None:
        self.since, self.failures = None, 0


class Committer(Generic[T, R]):
    """Hands values of type T to `write` (which returns R) on a thread of its own, one at a time."""

    def __init__(self, write: Callable[[T], R], limit_s: float, name: str,
                 behind: Callable[[Behind[T] | None], object] = lambda behind: None,
                 describe: Callable[[T], str] = str, merge: Callable[[T, T], T] | None = None,
                 probe: Callable[[], StorageUnavailableError | None] | None = None) -> None:
        """behind: told what waits for S3 after each failed try, and None once S3 took it. merge: what waits
        when a value is handed while another waits (default: the new one; the older one is worth nothing).
        probe: why S3 does not answer now, else None; room() asks it while a write keeps it waiting, since
        the S3 client's own retries of that write can outlast an outage."""
        self._write = write
        self._merge = merge
        self._behind = behind
        self._describe = describe
        self._name = name
        self.outage = Outage(limit_s)
        self._cond = threading.Condition()
        self._waiting: T | None = None
        self._writing = False
        self._in_flight: T | None = None  # the value being written
        self._probe = probe
        self._retry_at = 0.0  # time.monotonic() before which the waiting value is not tried
        self._error: BaseException | None = None
        self._last: R | None = None
        self._thread: threading.Thread | None = None  # the writer; one no longer named here ends

    @property
    def out(self) -> bool:
        """Whether S3 is out for this writer (a value waits for it, to be tried again)."""
        with self._cond:
            return self.outage.ongoing

    def idle(self) -> bool:
        with self._cond:
            return not self._writing and self._waiting is None and self._error is None

    def room(self) -> None:
        """Waits until nothing is being written, or S3 is out (a new value then replaces the waiting one);
        raises the error of a write that failed for good. With a probe, a write that keeps it waiting while
        S3 does not answer counts as a failed try: the outage begins, and room() returns."""
        while True:
            with self._cond:
                if self._cond.wait_for(self._roomy, timeout=None if self._probe is None else PROBE_EVERY_SECONDS):
                    self._raise()
                    return
                value = self._in_flight
            assert self._probe is not None
            error = self._probe()
            if error is None or value is None:
                continue
            with self._cond:
                if self._in_flight is not value or self.outage.ongoing:
                    continue
                behind = self._failed(value, error)
            self._say(behind)

    def _roomy(self) -> bool:
        return self._error is not None or self.outage.ongoing or (not self._writing and self._waiting is None)

    def hand(self, value: T, failed: StorageUnavailableError | None = None) -> None:
        """Writes `value` on the thread, in place of one that waits. failed: the error of a write of it the
        caller tried itself (it is tried again after a delay; raised at once past the outage limit)."""
        behind = None
        with self._cond:
            self._raise()
            if self._waiting is not None and self._merge is not None:
                value = self._merge(self._waiting, value)
            elif self._waiting is not None:
                log.warning("%s: %s is not written to S3, which is still out; %s replaces it", self._name,
                            self._describe(self._waiting), self._describe(value))
            if failed is not None:
                behind = self._failed(value, failed)
            self._waiting = value
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"ddp-{self._name}", daemon=True)
                self._thread.start()
            self._cond.notify_all()
        if behind is not None:
            self._say(behind)

    def wait(self) -> R | None:
        """Blocks until what was handed is written (through an outage up to its limit); returns the last
        write's result and raises the error of one that failed for good."""
        with self._cond:
            self._cond.wait_for(lambda: self._error is not None or (not self._writing and self._waiting is None))
            self._raise()
            return self._last

    def close(self) -> R | None:
        """Waits as wait() does, then ends the thread (a value handed later starts another)."""
        try:
            return self.wait()
        finally:
            with self._cond:
                thread, self._thread = self._thread, None
                self._cond.notify_all()
            if thread is not None:
                thread.join()

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _failed(self, value: T, error: StorageUnavailableError) -> Behind[T]:
        """Under the lock: counts a failed try of `value`; raises `error` past the limit."""
        if not self.outage.failed(time.time(), time.monotonic()):
            raise StorageUnavailableError(
                f"{error} (S3 unreachable for over {self.outage.limit_s:g} s, DDP_S3_OUTAGE_SECONDS)") from error
        self._retry_at = time.monotonic() + retry_delay(self.outage.failures)
        if self.outage.failures == 1:
            log.warning("%s: S3 cannot be reached, training goes on: %s waits and is tried again in the "
                        "background for up to %g s (DDP_S3_OUTAGE_SECONDS): %s", self._name,
                        self._describe(value), self.outage.limit_s, error)
        assert self.outage.since is not None
        return Behind(value, self.outage.since, str(error))

    def _next(self) -> list[T]:
        """The value to write next, or none once this thread is no longer the writer (closed)."""
        with self._cond:
            while self._thread is threading.current_thread():
                if self._waiting is not None:
                    delay = self._retry_at - time.monotonic()
                    if delay <= 0:
                        value, self._waiting, self._writing = self._waiting, None, True
                        self._in_flight = value
                        return [value]
                    self._cond.wait(delay)
                else:
                    self._cond.wait()
            return []

    def _run(self) -> None:
        while next_value := self._next():
            value = next_value[0]
            told: Behind[T] | None = None
            caught_up = False
            try:
                result = self._write(value)
            except StorageUnavailableError as error:
                with self._cond:
                    try:
                        told = self._failed(value, error)
                        if self._waiting is None:
                            self._waiting = value
                        elif self._merge is not None:  # handed while this one was being written
                            self._waiting = self._merge(value, self._waiting)
                    except StorageUnavailableError as final:
                        self._error, self._waiting = final, None
                    self._writing, self._in_flight = False, None
                    self._cond.notify_all()
            except BaseException as error:  # noqa: BLE001 - raised to whoever hands or waits next
                with self._cond:
                    self._error, self._writing, self._in_flight = error, False, None
                    self._cond.notify_all()
            else:
                with self._cond:
                    caught_up = self.outage.ongoing
                    if caught_up:
                        log.warning("%s: S3 answers again; %s is written", self._name, self._describe(value))
                    self.outage.ended()
                    self._retry_at = 0.0
                    self._last, self._writing, self._in_flight = result, False, None
                    self._cond.notify_all()
            if told is not None:
                self._say(told)
            elif caught_up:
                self._say(None)

    def _say(self, behind: Behind[T] | None) -> None:
        try:
            self._behind(behind)
        except Exception as error:  # noqa: BLE001 - saying so must not stop the writes
            log.warning("%s: could not say what waits for S3: %s", self._name, error)
