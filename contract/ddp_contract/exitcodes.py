"""A rank's exit codes, which of them a retry can cure, and whose fault a failure is.

Codes 1-127 are the program's own (permanent under restartPolicy ExitCode); 128-255 are retried:
128+N is a process killed by signal N (137 SIGKILL or an OOM kill, 143 SIGTERM), and the runtime's
infrastructure codes sit at 200+ so they never collide with those.
"""

from __future__ import annotations

import signal
from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    # Permanent: retrying the same pod would fail the same way.
    USER_ERROR = 1  # the user's code raised
    CONFIG_ERROR = 2  # bad or missing environment / arguments / entrypoint
    # Stopped from outside: the runtime caught SIGTERM (pod deleted, node drained, preempted).
    TERMINATED = 128 + signal.SIGTERM
    # Retryable infrastructure failures.
    MASTER_UNRESOLVED = 200  # MASTER_ADDR did not resolve within the wait
    RENDEZVOUS_FAILED = 201  # init_process_group timed out or could not reach the store
    COMMUNICATION_ERROR = 202  # a collective failed (peer died, NCCL/gloo error)
    STORAGE_UNAVAILABLE = 203  # S3 endpoint unreachable or throttling beyond retries
    HUNG = 204  # the step did not advance within the hang timeout; stacks were dumped

    @property
    def retryable(self) -> bool:
        return self is not ExitCode.OK and is_retryable_exit(self)


# The runtime's own infrastructure codes: the gang, the network or storage failed, not the program.
INFRASTRUCTURE_EXITS = frozenset({
    ExitCode.TERMINATED, ExitCode.MASTER_UNRESOLVED, ExitCode.RENDEZVOUS_FAILED, ExitCode.COMMUNICATION_ERROR,
    ExitCode.STORAGE_UNAVAILABLE, ExitCode.HUNG,
})
SIGKILL_EXIT = 128 + signal.SIGKILL


def is_retryable_exit(code: int) -> bool:
    """Whether a failed container's exit code is worth a retry: 1-127 are permanent, the rest not."""
    return not 1 <= code <= 127


def is_infrastructure_exit(code: int, oom_killed: bool = False) -> bool:
    """Whether an exit is the infrastructure's doing: the runtime's infrastructure codes, SIGTERM,
    and SIGKILL from outside (an OOM kill is the program's: it asked for too little memory or used
    too much). Everything else (1-127, SIGSEGV, SIGABRT, ...) is the program's."""
    if code == SIGKILL_EXIT:
        return not oom_killed
    return code in INFRASTRUCTURE_EXITS
