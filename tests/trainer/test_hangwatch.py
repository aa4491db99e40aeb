"""The hang watch's timeout and trigger, on a fake clock; the real hang is in test_entrypoint.py."""

from __future__ import annotations

from ddp_trainer.runtime.hangwatch import STEP_FACTOR, Hang, HangWatch, hang_timeout
from ddp_trainer.runtime.heartbeat import Heartbeat


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_timeout_is_configured_or_derived_from_the_slowest_step_with_a_floor() -> None:
    assert hang_timeout(30.0, 100.0, 300.0) == 30.0
    assert hang_timeout(0.0, 100.0, 300.0) is None  # 0: never
    assert hang_timeout(None, 1.0, 300.0) == 300.0
    assert hang_timeout(None, 60.0, 300.0) == STEP_FACTOR * 60.0


def test_the_clock_starts_at_the_first_step_and_restarts_with_each_new_one() -> None:
    clock = Clock()
    beat = Heartbeat(clock)
    fired: list[Hang] = []
    watch = HangWatch(beat, None, 5.0, fired.append)
    clock.now = 100.0
    assert watch.check() is None  # no step yet: startup is the rendezvous timeout's business
    beat.beat(1)
    clock.now = 102.0
    beat.beat(2)  # a 2 s step: the derived timeout is max(5, 10 x 2) = 20 s
    beat.beat(2)  # the same step again does not restart the clock
    clock.now = 121.0
    assert watch.check() is None
    clock.now = 122.5
    hang = watch.check()
    assert hang is not None and hang.step == 2 and hang.timeout_s == 20.0
    assert hang.describe() == "no progress for 20s since step 2 (hang timeout 20s)"


def test_a_watch_with_timeout_zero_never_starts() -> None:
    watch = HangWatch(Heartbeat(), 0.0, 5.0, lambda hang: None).start()
    assert not watch._thread.is_alive()


def test_a_stalled_rank_saves_its_stacks_ahead_at_half_its_timeout_once_per_stalled_step() -> None:
    """With a derived timeout a peer may fire first and the restart take this rank's pod before its
    own timeout: its stacks are saved at half of it, once per step it stalls on."""
    clock = Clock()
    beat = Heartbeat(clock)
    stalls: list[Hang] = []
    hangs: list[Hang] = []
    watch = HangWatch(beat, 20.0, 5.0, hangs.append, on_stall=stalls.append)
    beat.beat(1)
    clock.now = 9.0
    assert not watch.poll() and stalls == []
    clock.now = 10.5
    assert not watch.poll() and [(s.step, s.stalled_s) for s in stalls] == [(1, 10.5)]
    clock.now = 15.0
    assert not watch.poll() and len(stalls) == 1  # once for this step
    beat.beat(2)
    clock.now = 26.0
    assert not watch.poll() and [s.step for s in stalls] == [1, 2]  # a new stall, a new dump
    clock.now = 35.5
    assert watch.poll() and hangs[0].step == 2 and watch.fired.is_set()
