"""A rank's exit codes and which of them a retry can cure.

Codes 1-127 are the program's own (permanent under restartPolicy ExitCode); 128-255 are retried:
128+N is a process killed by signal N (137 SIGKILL or an OOM kill, 143 SIGTERM), and the runtime's
infrastructure codes sit at 200+ so they never collide with those.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    # Permanent: retrying the same pod would fail the same way.
    USER_ERROR = 1  # the user's code raised
    CONFIG_ERROR = 2  # bad or missing environment / arguments / entrypoint
    # Retryable infrastructure failures.
    MASTER_UNRESOLVED = 200  # MASTER_ADDR did not resolve within the wait
    RENDEZVOUS_FAILED = 201  # init_process_group timed out or could not reach the store
    COMMUNICATION_ERROR = 202  # a collective failed (peer died, NCCL/gloo error)
    STORAGE_UNAVAILABLE = 203  # S3 endpoint unreachable or throttling beyond retries

    @property
    def retryable(self) -> bool:
        return self is not ExitCode.OK and is_retryable_exit(self)


def is_retryable_exit(code: int) -> bool:
    """Whether a failed container's exit code is worth a retry: 1-127 are permanent, the rest not."""
    return not 1 <= code <= 127
