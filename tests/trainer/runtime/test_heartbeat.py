"""The heartbeat: each rank's step and when it last advanced; `ddp_trainer.heartbeat(step)` for code that reports no progress."""

from __future__ import annotations

from trainerhelp import FakeClock

import ddp_trainer
import ddp_trainer.runtime.entrypoint
from ddp_trainer.runtime.heartbeat import HEARTBEAT, Heartbeat


def test_a_step_advances_once_and_the_slowest_wait_between_steps_is_kept() -> None:
    clock = FakeClock()
    beat = Heartbeat(clock)
    assert beat.stalled_for() is None  # before the first step
    beat.beat(1)
    clock.now = 2.0
    beat.beat(1)  # the same step again: no advance
    assert beat.stalled_for() == 2.0
    beat.beat(2)
    clock.now = 3.0
    beat.beat(3)
    assert (beat.step, beat.slowest_step_s, beat.stalled_for()) == (3, 2.0, 0.0)
    beat.reset()
    assert (beat.step, beat.stalled_for(), beat.slowest_step_s) == (None, None, 0.0)


def test_ddp_trainer_heartbeat_is_the_function_in_a_running_rank() -> None:
    """Not the module of that name, which the runtime has imported by then."""
    HEARTBEAT.reset()
    try:
        ddp_trainer.heartbeat(7)
        assert HEARTBEAT.step == 7
    finally:
        HEARTBEAT.reset()
