"""The operator's work queue: one reconcile per key at a time, coalescing, delays and backoff."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from ddp_operator.passerrors import RetryLater
from ddp_operator.workqueue import WorkQueue

WAIT_S = 10.0  # how long a test waits for something the queue is to do before it fails


def run(coro):
    return asyncio.run(coro)


async def within(awaitable) -> None:
    await asyncio.wait_for(awaitable, WAIT_S)


def test_keys_added_during_a_reconcile_are_coalesced_into_one_more_run() -> None:
    async def scenario() -> list[str]:
        calls: list[str] = []
        started, gate = asyncio.Event(), asyncio.Event()

        async def reconcile(key):
            calls.append(key)
            if len(calls) == 1:
                started.set()
                await gate.wait()
            return None

        queue = WorkQueue(reconcile, workers=4)
        queue.start()
        queue.add("a")
        await within(started.wait())
        for _ in range(5):
            queue.add("a")  # while the first run is in flight
        gate.set()
        await within(queue.join())
        await queue.stop()
        return calls

    assert run(scenario()) == ["a", "a"]


def test_a_key_is_never_reconciled_twice_at_once() -> None:
    async def scenario() -> tuple[int, int]:
        running, most, calls = 0, 0, 0
        started, gate = asyncio.Event(), asyncio.Event()

        async def reconcile(key):
            nonlocal running, most, calls
            running += 1
            calls += 1
            most = max(most, running)
            started.set()
            await gate.wait()
            running -= 1
            return None

        queue = WorkQueue(reconcile, workers=8)
        queue.start()
        queue.add("job")
        await within(started.wait())
        for _ in range(20):
            queue.add("job")  # seven idle workers, each given its turn to take it
            for _ in range(3):
                await asyncio.sleep(0)
        gate.set()
        await within(queue.join())
        await queue.stop()
        return most, calls

    assert run(scenario()) == (1, 2)


def test_requeue_after_runs_the_key_again_later() -> None:
    delay = 0.05

    async def scenario() -> tuple[int, float]:
        loop = asyncio.get_running_loop()
        returned_at, again_at, again = 0.0, 0.0, asyncio.Event()
        calls = 0

        async def reconcile(key):
            nonlocal calls, returned_at, again_at
            calls += 1
            if calls == 1:
                returned_at = loop.time()
                return delay
            again_at = loop.time()
            again.set()
            return None

        queue = WorkQueue(reconcile, workers=1)
        queue.start()
        queue.add("job")
        await within(queue.join())
        assert calls == 1  # the first run is over and the key waits out its delay
        await within(again.wait())
        await within(queue.join())
        await queue.stop()
        return calls, again_at - returned_at

    calls, waited = run(scenario())
    assert calls == 2
    assert waited >= delay - time.get_clock_info("monotonic").resolution


def test_failures_back_off_exponentially_up_to_a_cap_and_reset_on_success() -> None:
    queue = WorkQueue(lambda key: None, error_backoff=0.5, max_backoff=4.0)  # type: ignore[arg-type,return-value]
    assert [queue.backoff("k") for _ in range(5)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    queue.forget("k")
    assert queue.backoff("k") == 0.5


@pytest.mark.parametrize(("raised", "traceback"), [(RetryLater("said on the job"), False), (KeyError("x"), True)])
def test_a_failed_pass_is_tried_again_with_backoff_and_only_an_unsaid_one_logs_its_traceback(
        raised: Exception, traceback: bool, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> int:
        calls = 0
        done = asyncio.Event()

        async def reconcile(key):
            nonlocal calls
            calls += 1
            if calls < 3:
                raise raised
            done.set()
            return None

        queue = WorkQueue(reconcile, workers=1, error_backoff=0.01)
        queue.start()
        queue.add("a")
        await within(done.wait())
        await queue.stop()
        return calls

    with caplog.at_level(logging.DEBUG, logger="ddp_operator.workqueue"):
        assert run(scenario()) == 3
    failed = [record for record in caplog.records if "failed" in record.getMessage()]
    assert len(failed) == 2 and all((record.exc_info is not None) is traceback for record in failed)


def test_a_key_added_during_its_pass_waits_its_pace_and_join_waits_for_it() -> None:
    pace_s = 0.3

    async def scenario() -> list[float]:
        starts: list[float] = []
        started, gate = asyncio.Event(), asyncio.Event()

        async def reconcile(key):
            starts.append(time.monotonic())
            if len(starts) == 1:
                started.set()
                await gate.wait()
            return None

        queue = WorkQueue(reconcile, workers=2, pace=lambda key: pace_s if key == "big" else 0.0)
        queue.start()
        queue.add("big")
        await within(started.wait())
        queue.add("big")  # news while the pass runs
        gate.set()
        await within(queue.join())  # returns only after the paced pass ran
        ended = len(starts)
        queue.add("small")
        await within(queue.join())
        await queue.stop()
        assert ended == 2, "join() returned before the paced pass"
        return starts

    first, second, small = run(scenario())
    assert second - first >= pace_s, "the key's second pass came before its pace allowed"
    assert small >= second


def test_a_paced_key_added_again_and_again_runs_once_and_forgetting_it_drops_the_wait() -> None:
    async def scenario() -> tuple[int, bool]:
        calls = 0

        async def reconcile(key):
            nonlocal calls
            calls += 1
            return None

        queue = WorkQueue(reconcile, workers=2, pace=lambda key: 60.0)
        queue.start()
        queue.add("a")
        await within(queue.join())
        for _ in range(5):
            queue.add("a")  # within its pace: one paced pass, later
        waiting = not queue._idle.is_set()
        queue.forget("a")  # the job is gone: nothing is left to wait for
        await within(queue.join())
        await queue.stop()
        return calls, waiting

    calls, waiting = run(scenario())
    assert waiting, "the paced key did not count as work to do"
    assert calls == 1
