"""Leaving the rank's process with its exit code, and nothing after it that could change the code."""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading

from ..errors import ExitCode
from . import logkeeper

_EXITING = threading.Event()


def exiting() -> bool:
    """Whether this process is on its way out (exit_process has begun)."""
    return _EXITING.is_set()


def exit_process(code: int) -> None:
    """Exit with `code`, skipping the interpreter's teardown and the C exit handlers after it: C++
    threads left by the backend or DDP can abort the process there (SIGABRT, "terminate called
    without an active exception"), after a broken collective and now and then after a clean run,
    which would turn the rank's code into a crash. A clean exit first does what Python's own exit
    does before its teardown: waits for the user's non-daemon threads and runs the atexit handlers;
    a failure skips them (its code is decided). What the rank printed goes to S3 first (logkeeper)."""
    _EXITING.set()
    if code == ExitCode.OK:
        _join_user_threads()
        atexit._run_exitfuncs()  # Python's exit runs them (logging.shutdown among them) before its teardown
    hurried = code in (ExitCode.TERMINATED, ExitCode.HUNG, ExitCode.STORAGE_UNAVAILABLE)
    logkeeper.finish(logkeeper.FINAL_UPLOAD_SECONDS if hurried else logkeeper.ENDED_UPLOAD_SECONDS)
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


def _join_user_threads() -> None:
    """What Python's exit does first: wait for every non-daemon thread still running."""
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
