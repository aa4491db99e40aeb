"""How a rank's failure ends it: the exit code an exception maps to (ddp_contract.exitcodes), and its
last words, the failure line (ddp_contract.failureline) on stderr and in the termination message."""

from __future__ import annotations

import sys
import traceback

from ddp_contract.failureline import format_line

from ..errors import ExitCode, TrainerError
from .heartbeat import HEARTBEAT
from .termination import leave_termination_message


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


_COMMUNICATION_MARKERS = ("gloo", "nccl", "connection closed by peer", "connection reset by peer", "broken pipe")


def classify(exc: BaseException) -> ExitCode:
    """Map an exception escaping the user's code to an exit code (see errors.ExitCode)."""
    import torch.distributed as dist

    for item in _chain(exc):
        if isinstance(item, TrainerError):
            return item.exit_code
        if isinstance(item, (dist.DistStoreError, dist.DistNetworkError)):
            return ExitCode.COMMUNICATION_ERROR
        if isinstance(item, dist.DistBackendError):
            return ExitCode.COMMUNICATION_ERROR
        if type(item).__module__.startswith(("botocore", "urllib3")) and _is_connection_error(item):
            return ExitCode.STORAGE_UNAVAILABLE
        # Older torch builds raise a bare RuntimeError from the backends.
        if type(item) is RuntimeError and any(m in str(item).lower() for m in _COMMUNICATION_MARKERS):
            return ExitCode.COMMUNICATION_ERROR
    return ExitCode.USER_ERROR


def _is_connection_error(exc: BaseException) -> bool:
    from botocore.exceptions import ConnectionError as BotoConnectionError
    from botocore.exceptions import ConnectTimeoutError, ReadTimeoutError

    return isinstance(exc, (BotoConnectionError, ConnectTimeoutError, ReadTimeoutError))


def exit_code_of_system_exit(exc: SystemExit) -> int:
    """The user's `sys.exit(n)`: n unchanged; None is 0, and a message is printed and exits 1."""
    if exc.code is None:
        return ExitCode.OK
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return ExitCode.USER_ERROR


def report(code: ExitCode, rank: int | None, exc: BaseException) -> None:
    """The failure's last words; a user error's traceback before them (its end in the termination message)."""
    lines: list[str] = []
    error = str(exc)
    if code == ExitCode.USER_ERROR and not isinstance(exc, TrainerError):
        lines = traceback.format_exception(exc)
        sys.stderr.write("".join(lines))
        error = f"{type(exc).__name__}: {exc}"
    last_words(code, rank, error, "".join(lines[-6:]))


def last_words(code: ExitCode, rank: int | None, error: str, before: str = "") -> None:
    """The failure line (rank, step, exit code, error; ddp_contract.failureline) on stderr and in the
    termination message, after `before` (the end of a traceback)."""
    line = format_line(rank, HEARTBEAT.step, int(code), code.name, code.retryable, error)
    print(line, file=sys.stderr, flush=True)
    leave_termination_message(before + line)
