"""The operator's work queue: one reconcile per key at a time, coalescing, delays and backoff."""

from __future__ import annotations

import asyncio

from ddp_operator.workqueue import WorkQueue


def run(coro):
    return asyncio.run(coro)


def test_keys_added_during_a_reconcile_are_coalesced_into_one_more_run() -> None:
    async def scenario() -> list[str]:
        calls: list[str] = []
        gate = asyncio.Event()

        async def reconcile(key):
            calls.append(key)
            if len(calls) == 1:
                await gate.wait()
            return None

        queue = WorkQueue(reconcile, workers=4)
        queue.start()
        queue.add("a")
        await asyncio.sleep(0.01)
        for _ in range(5):
            queue.add("a")  # while the first run is in flight
        gate.set()
        await asyncio.sleep(0.05)
        await queue.stop()
        return calls

    assert run(scenario()) == ["a", "a"]


def test_a_key_is_never_reconciled_twice_at_once() -> None:
    async def scenario() -> int:
        running, most = 0, 0

        async def reconcile(key):
            nonlocal running, most
            running += 1
            most = max(most, running)
            await asyncio.sleep(0.01)
            running -= 1
            return None

        queue = WorkQueue(reconcile, workers=8)
        queue.start()
        for _ in range(20):
            queue.add("job")
            await asyncio.sleep(0.002)
        await asyncio.sleep(0.1)
        await queue.stop()
        return most

    assert run(scenario()) == 1


def test_requeue_after_runs_the_key_again_later() -> None:
    async def scenario() -> int:
        calls = 0

        async def reconcile(key):
            nonlocal calls
            calls += 1
            return 0.05 if calls == 1 else None

        queue = WorkQueue(reconcile, workers=1)
        queue.start()
        queue.add("job")
        await asyncio.sleep(0.02)
        assert calls == 1
        await asyncio.sleep(0.1)
        await queue.stop()
        return calls

    assert run(scenario()) == 2


def test_failures_back_off_exponentially_up_to_a_cap_and_reset_on_success() -> None:
    queue = WorkQueue(lambda key: None, error_backoff=0.5, max_backoff=4.0)  # type: ignore[arg-type,return-value]
    assert [queue.backoff("k") for _ in range(5)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    queue.forget("k")
    assert queue.backoff("k") == 0.5
