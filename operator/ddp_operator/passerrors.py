"""A pass that raised: whether trying again may help, and the words that say it on the job.

The API server or the network (a server error, too many requests, a conflict, a connection reset, a
timeout) may answer otherwise next time: the work queue tries again with backoff and the log says so in
a line. Anything else came from what the job holds (its spec, its status, its pods) meeting a case the
operator does not handle, and the same input fails the same way: the job says it (reason ReconcileError
and a Warning Event), once, the log has the traceback once, and the queue still tries again with
backoff, in case the input changes.
"""

from __future__ import annotations

import logging
import traceback
from pathlib import Path

from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError

from ddp_operator.kubeapi import api_message

# API answers that may differ on the next try.
TRANSIENT_STATUS = frozenset({409, 429})
# The frames that name where the operator failed: its own and the contract's, not the libraries'.
OWN_PACKAGES = ("ddp_operator", "ddp_contract")
MAX_DETAIL = 300


class RetryLater(Exception):
    """A pass that failed and has said why where it belongs (on the job, once in the log): the work queue
    tries again with backoff and logs it at `level` in a line, without a traceback."""

    def __init__(self, message: str, level: int = logging.DEBUG) -> None:
        super().__init__(message)
        self.level = level


def is_transient(error: BaseException) -> bool:
    """Whether the API server or the network may answer otherwise next time."""
    if isinstance(error, ApiException):
        return not error.status or error.status in TRANSIENT_STATUS or error.status >= 500
    return isinstance(error, HTTPError | OSError)


def describe_error(error: BaseException) -> str:
    """The error and the operator's frame it left: "OverflowError: date value out of range (deadlines.py:29
    in deadline_remaining)"; the same words each time the same input fails."""
    text = f"{error.status} {api_message(error)}" if isinstance(error, ApiException) else str(error).strip()
    detail = text.splitlines()[0][:MAX_DETAIL] if text else ""
    said = f"{type(error).__name__}: {detail}" if detail else type(error).__name__
    own = [frame for frame in traceback.extract_tb(error.__traceback__)
           if any(part in OWN_PACKAGES for part in Path(frame.filename).parts)]
    if not own:
        return said
    frame = own[-1]
    return f"{said} ({Path(frame.filename).name}:{frame.lineno} in {frame.name})"


def failed_pass_message(error: BaseException, what: str) -> str:
    """status.message (and the Event's) for a pass that raised on this job; `what` names the pass."""
    return (f"the operator's {what} failed on this job: {describe_error(error)}; it tries again with growing "
            "pauses (at most a minute apart). A spec value it cannot hold is the likely cause: compare the spec "
            "with the DDPJob reference's limits and fix it, or report this with the operator's log")
