"""SIGTERM (a deleted pod, a drained node, a preempted job) stops the rank at once, saying so."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import ExitCode
from .process_exit import exit_process, exiting
from .rankexit import last_words


def stop_on_sigterm(rank: int | None) -> None:
    """A deleted pod's container gets SIGTERM, and a Python PID 1 ignores it unless handled: the pod
    would then wait out its whole grace period, and every gang restart with it. Exit at once with
    TERMINATED (peers see the connection drop), saying why."""
    if threading.current_thread() is not threading.main_thread():
        return

    def stop(signum: int, frame: object) -> None:
        if exiting():
            # Already leaving with its own code, its output on the way to S3: cutting that short would
            # lose the rank's last words (a gang restart's SIGTERM comes while a failed rank exits).
            return
        last_words(ExitCode.TERMINATED, rank, "stopped by SIGTERM (pod deleted, node drained or job preempted)")
        exit_process(ExitCode.TERMINATED)

    signal.signal(signal.SIGTERM, stop)


@contextmanager
def dies_on_sigterm() -> Iterator[None]:
    """Within: SIGTERM ends the process at once, as it does a process without a handler. For native
    calls that block where Python runs no handler: init_process_group connecting to a rank 0 whose pod
    is gone waits out its timeout, and a restart in place would wait for its SIGKILL. Nothing is lost
    (no step trained yet). A PID 1 (a rank alone in its container) keeps its handler: the kernel
    ignores SIGTERM there without one."""
    if os.getpid() == 1 or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
