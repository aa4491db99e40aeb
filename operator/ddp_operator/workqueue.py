"""A keyed work queue for asyncio, in the manner of controller-runtime's.

A key (namespace, job name) is reconciled by at most one worker at a time; keys added while
their reconcile runs are coalesced into one more run afterwards, once the key's pace allows; a
reconcile can ask to run again after a delay (deadlines, TTLs, backoff). A reconcile that raises is
tried again with backoff: RetryLater (it said why itself) is logged in a line, anything else with its
traceback.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

from ddp_operator import metrics
from ddp_operator.passerrors import RetryLater

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(self, reconcile: Callable[[K], Awaitable[float | None]], *, workers: int = 16, error_backoff: float = 0.5,
                 max_backoff: float = 60.0, name: str = "default", pace: Callable[[K], float] | None = None) -> None:
        """name: the queue's label in the metrics (depth, pass latency, errors).
        pace: seconds the key's next reconcile waits after one ends, however often the key is added meanwhile."""
        self._reconcile = reconcile
        self.name = name
        self._queue: asyncio.Queue[K] = asyncio.Queue()
        self._queued: set[K] = set()
        self._running: set[K] = set()
        self._dirty: set[K] = set()
        self._pace = pace
        self._not_before: dict[K, float] = {}  # monotonic time before which a paced key is not reconciled
        self._paced: set[K] = set()  # added, waiting out their pace
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._workers = workers
        self._error_backoff = error_backoff
        self._max_backoff = max_backoff
        self._failures: dict[K, int] = {}
        self._tasks: list[asyncio.Task] = []
        self._idle = asyncio.Event()
        self._idle.set()
        metrics.QUEUE_DEPTH.labels(name).set_function(lambda: len(self._queued))
        metrics.RECONCILE_ERRORS.labels(name)  # at 0 from the start: a counter born at 1 hides its first error from rate()

    def add(self, key: K) -> None:
        """Schedules a reconcile of key now, or once its pace allows (coalesced with any pending one)."""
        if key in self._running:
            self._dirty.add(key)
        elif key in self._paced:
            return
        elif (wait := self._not_before.get(key, 0.0) - time.monotonic()) > 0:
            self._paced.add(key)
            self._idle.clear()
            self.add_after(key, wait)
        elif key not in self._queued:
            self._queued.add(key)
            self._idle.clear()
            self._queue.put_nowait(key)

    def pending(self) -> frozenset[K]:
        """The keys waiting for a worker (not those being reconciled, nor those waiting out a delay)."""
        return frozenset(self._queued)

    async def join(self) -> None:
        """Returns once no key waits for a worker, its pace or is being reconciled (those waiting out a
        delay they asked for aside)."""
        await self._idle.wait()

    def add_after(self, key: K, delay: float) -> None:
        """Schedules a reconcile of key after delay seconds, unless an earlier one is pending."""
        loop = asyncio.get_running_loop()
        timer = self._timers.get(key)
        when = loop.time() + delay
        if timer is not None and timer.when() <= when:
            return
        if timer is not None:
            timer.cancel()
        self._timers[key] = loop.call_at(when, self._fire, key)

    def add_threadsafe(self, loop: asyncio.AbstractEventLoop, key: K) -> None:
        loop.call_soon_threadsafe(self.add, key)

    def forget(self, key: K) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        self._failures.pop(key, None)
        self._not_before.pop(key, None)
        self._paced.discard(key)
        self._set_idle_if_done()

    def backoff(self, key: K) -> float:
        """Doubles with each failure in a row, so a persistent error (a quota, say) is not a hot loop."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        return min(self._error_backoff * 2**failures, self._max_backoff)

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self._paced.discard(key)
        self.add(key)
        self._set_idle_if_done()

    def _set_idle_if_done(self) -> None:
        if not self._queued and not self._running and not self._paced:
            self._idle.set()

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._work(), name=f"reconcile-worker-{i}") for i in range(self._workers)]

    async def stop(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _work(self) -> None:
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            self._running.add(key)
            started = time.monotonic()
            try:
                requeue_after = await self._reconcile(key)
                self._failures.pop(key, None)
            except asyncio.CancelledError:
                raise
            except RetryLater as failed:
                metrics.RECONCILE_ERRORS.labels(self.name).inc()
                requeue_after = self.backoff(key)
                log.log(failed.level, "%s pass of %s failed: %s; retrying in %.1fs", self.name, key, failed,
                        requeue_after)
            except Exception:
                metrics.RECONCILE_ERRORS.labels(self.name).inc()
                requeue_after = self.backoff(key)
                log.exception("reconcile of %s failed; retrying in %.1fs", key, requeue_after)
            finally:
                self._running.discard(key)
                ended = time.monotonic()
                metrics.RECONCILE_SECONDS.labels(self.name).observe(ended - started)
                if self._pace is not None:
                    self._not_before[key] = ended + self._pace(key)
            if key in self._dirty:
                self._dirty.discard(key)
                self.add(key)
            elif requeue_after is not None:
                self.add_after(key, requeue_after)
            self._set_idle_if_done()
