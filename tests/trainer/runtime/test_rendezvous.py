"""Joining the gang in real processes: rank 0's name and port, init_process_group, the all-reduce check."""

from __future__ import annotations

import time
from pathlib import Path

from trainerhelp import describe as _describe
from trainerhelp import launch

from ddp_contract.failures import parse_line
from ddp_trainer.errors import ExitCode


def test_master_that_never_resolves_is_retryable() -> None:
    started = time.monotonic()
    (result,) = launch(
        "ddp_workloads:train", 2, {"MASTER_ADDR": "ddp-master.invalid", "DDP_MASTER_WAIT_SECONDS": "2"}, ranks=[1]
    )
    assert result.returncode == ExitCode.MASTER_UNRESOLVED, result.stderr
    assert "MASTER_ADDR='ddp-master.invalid' did not resolve" in result.stderr
    assert time.monotonic() - started < 60


def test_rendezvous_timeout_is_retryable() -> None:
    # Rank 0 alone: rank 1 never arrives, so init_process_group times out.
    (result,) = launch("ddp_workloads:train", 2, {"DDP_INIT_TIMEOUT_SECONDS": "3"}, ranks=[0])
    assert result.returncode == ExitCode.RENDEZVOUS_FAILED, result.stderr
    assert "joining the process group at 127.0.0.1" in result.stderr


def test_a_rank_whose_master_resolves_but_does_not_listen_is_named() -> None:
    (result,) = launch("ddp_workloads:train", 2, {"DDP_MASTER_WAIT_SECONDS": "2"}, ranks=[1])
    assert result.returncode == ExitCode.RENDEZVOUS_FAILED, result.stderr
    line = parse_line(result.stderr)
    assert line is not None and line.rank == 1 and "rank 0 at 127.0.0.1:" in line.error
    assert "did not accept connections within 2s" in line.error


def test_the_gang_is_checked_with_an_all_reduce_before_user_code(s3_env, bucket, tmp_path: Path) -> None:
    results = launch("ddp_workloads:use_collective", 2, {"DDP_INIT_TIMEOUT_SECONDS": "20"})
    assert all("all-reduce check" in r.stderr for r in results), _describe(results)
