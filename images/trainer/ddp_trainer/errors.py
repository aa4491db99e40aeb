"""Error types and the process exit codes the operator's ExitCode policy acts on.

The operator treats exit codes 1-127 as permanent failures and 128-255 as retryable. The
retryable codes below sit at 200+ so they never collide with 128+N, the code a shell reports
for a process killed by signal N (137 = SIGKILL/OOM, 143 = SIGTERM), which are retryable too.
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
        return self >= 128


class TrainerError(Exception):
    """Base of the runtime's errors; `exit_code` says how the entrypoint exits on it."""

    exit_code: ExitCode = ExitCode.USER_ERROR


class ConfigError(TrainerError):
    """The environment or arguments are wrong; names what is wrong."""

    exit_code = ExitCode.CONFIG_ERROR


class InfrastructureError(TrainerError):
    """A retryable failure outside the user's code."""

    exit_code = ExitCode.COMMUNICATION_ERROR


class MasterUnresolvedError(InfrastructureError):
    exit_code = ExitCode.MASTER_UNRESOLVED


class RendezvousError(InfrastructureError):
    exit_code = ExitCode.RENDEZVOUS_FAILED


class StorageUnavailableError(InfrastructureError):
    """S3 could not be reached (connection refused, DNS, timeouts, 5xx after retries)."""

    exit_code = ExitCode.STORAGE_UNAVAILABLE


class StorageError(TrainerError):
    """A permanent S3 problem: missing bucket or key, access denied, corrupt object.

    The message always names the bucket and key.
    """

    exit_code = ExitCode.USER_ERROR


class ObjectNotFoundError(StorageError):
    pass


class CorruptDataError(StorageError):
    pass
