"""The runtime's errors: each ends a rank with the exit code its kind says (ddp_contract.exitcodes)."""

from __future__ import annotations

from ddp_trainer import errors
from ddp_trainer.errors import ExitCode


def test_each_error_carries_its_exit_code_and_infrastructure_ones_are_retried() -> None:
    codes = {cls.__name__: cls.exit_code for cls in (
        errors.TrainerError, errors.ConfigError, errors.InfrastructureError, errors.MasterUnresolvedError,
        errors.RendezvousError, errors.StorageUnavailableError, errors.StorageError, errors.ObjectNotFoundError,
        errors.CorruptDataError)}
    assert codes == {
        "TrainerError": ExitCode.USER_ERROR, "ConfigError": ExitCode.CONFIG_ERROR,
        "InfrastructureError": ExitCode.COMMUNICATION_ERROR, "MasterUnresolvedError": ExitCode.MASTER_UNRESOLVED,
        "RendezvousError": ExitCode.RENDEZVOUS_FAILED, "StorageUnavailableError": ExitCode.STORAGE_UNAVAILABLE,
        "StorageError": ExitCode.USER_ERROR, "ObjectNotFoundError": ExitCode.USER_ERROR,
        "CorruptDataError": ExitCode.USER_ERROR,
    }
    assert all(cls.exit_code.retryable for cls in (errors.InfrastructureError, *errors.InfrastructureError.__subclasses__()))
    assert not any(cls.exit_code.retryable for cls in (errors.ConfigError, errors.StorageError,
                                                       *errors.StorageError.__subclasses__()))
