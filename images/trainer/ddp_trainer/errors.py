"""The runtime's error types; each says which exit code (ddp_contract.exitcodes) the rank exits with."""

from __future__ import annotations

from ddp_contract.exitcodes import ExitCode

__all__ = ["ExitCode", "TrainerError", "ConfigError", "InfrastructureError", "MasterUnresolvedError",
           "RendezvousError", "StorageUnavailableError", "StorageError", "ObjectNotFoundError", "CorruptDataError"]


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
