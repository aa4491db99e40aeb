"""Each rank's training step and when it last advanced: what the hang watch and a failure report read.

`ProgressReporter.report` beats on every rank (rank 0's also writes the job's progress); code that
reports no progress can call `ddp_trainer.heartbeat(step)` itself.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Heartbeat:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self.step: int | None = None
        self._advanced_at: float | None = None
        self.slowest_step_s = 0.0  # the longest wait so far between one step and the next

    def beat(self, step: int) -> None:
        now = self._clock()
        with self._lock:
            if step == self.step:
                return
            if self._advanced_at is not None:
                self.slowest_step_s = max(self.slowest_step_s, now - self._advanced_at)
            self.step = int(step)
            self._advanced_at = now

    def tick(self) -> None:
        """An advance that has no step number of its own (a command's output, a progress bar's update)."""
        with self._lock:
            step = (self.step or 0) + 1
        self.beat(step)

    def stalled_for(self) -> float | None:
        """Seconds since the step last advanced; None before the first step."""
        with self._lock:
            return None if self._advanced_at is None else self._clock() - self._advanced_at

    def reset(self) -> None:
        with self._lock:
            self.step, self._advanced_at, self.slowest_step_s = None, None, 0.0


HEARTBEAT = Heartbeat()


def heartbeat(step: int) -> None:
    """Tell the runtime this rank reached `step` (the hang watch restarts its clock)."""
    HEARTBEAT.beat(step)
