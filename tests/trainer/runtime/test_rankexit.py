"""How a failing rank ends: the exit code of what it raised (classify) and its last words; in real processes too."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainerhelp import describe as _describe
from trainerhelp import launch

from ddp_trainer.errors import ConfigError, ExitCode, StorageUnavailableError
from ddp_trainer.runtime.rankexit import classify, exit_code_of_system_exit


def test_user_exception_exits_1_names_rank_and_leaves_a_termination_message(tmp_path: Path) -> None:
    message = tmp_path / "termination-log"
    message.touch()  # the kubelet creates it in every container
    (result,) = launch("ddp_workloads:fail", 1, {"DDP_TERMINATION_MESSAGE_PATH": str(message)})
    assert result.returncode == ExitCode.USER_ERROR
    assert "ValueError: user code failed in rank 0" in result.stderr
    assert "exit 1 USER_ERROR, permanent" in result.stderr
    left = message.read_text()
    assert left.endswith(
        "ddp-trainer: error (rank 0, step -, exit 1 USER_ERROR, permanent): ValueError: user code failed in rank 0")
    assert "ValueError: user code failed in rank 0" in left and "Traceback" not in left.splitlines()[-1]


def test_peer_death_in_collective_is_retryable() -> None:
    results = launch("ddp_workloads:use_collective", 2, {"DDP_INIT_TIMEOUT_SECONDS": "20"})
    assert results[1].returncode == 0
    assert results[0].returncode == ExitCode.COMMUNICATION_ERROR, _describe(results)


def test_an_exception_s_exit_code_is_found_through_its_causes() -> None:
    assert classify(ValueError("bad input")) == ExitCode.USER_ERROR
    assert classify(ConfigError("no DDP_DATASET_URI")) == ExitCode.CONFIG_ERROR
    assert classify(RuntimeError("[../gloo/transport] Connection closed by peer")) == ExitCode.COMMUNICATION_ERROR
    try:
        try:
            raise StorageUnavailableError("s3://b/k: endpoint unreachable")
        except StorageUnavailableError as cause:
            raise ValueError("the loader failed") from cause
    except ValueError as wrapped:
        assert classify(wrapped) == ExitCode.STORAGE_UNAVAILABLE


def test_the_user_s_sys_exit_keeps_its_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code_of_system_exit(SystemExit()) == ExitCode.OK
    assert exit_code_of_system_exit(SystemExit(3)) == 3
    assert exit_code_of_system_exit(SystemExit("no data")) == ExitCode.USER_ERROR
    assert "no data" in capsys.readouterr().err
