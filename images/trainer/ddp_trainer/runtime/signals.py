"""SIGTERM (a deleted pod, a drained node, a preempted job) stops the rank at once, saying so."""

from __future__ import annotations

import signal
import threading

from ..errors import ExitCode
from .failures import last_words
from .process_exit import exit_process, exiting


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
