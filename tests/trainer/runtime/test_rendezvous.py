"""Joining the gang in real processes: rank 0's name and port, init_process_group, the all-reduce check."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.distributed as dist
from trainerhelp import describe as _describe
from trainerhelp import launch, rank_env

from ddp_contract.failureline import parse_line
from ddp_trainer import env
from ddp_trainer.errors import ExitCode, RendezvousError
from ddp_trainer.runtime.rendezvous import ATTEMPT_KEY, gang_store
from kube import wait_until
from ports import free_port


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


def test_the_gang_is_checked_with_an_all_reduce_before_user_code() -> None:
    # Each rank's output reaches its stderr through the runtime's tee: a rank must end by returning
    # (not os._exit) for all of it to arrive.
    results = launch("ddp_workloads:nothing", 2, {"DDP_INIT_TIMEOUT_SECONDS": "20"})
    assert [r.returncode for r in results] == [0, 0], _describe(results)
    assert all(f"rank {r.rank}/2 joined" in r.stderr and "all-reduce check" in r.stderr for r in results), \
        _describe(results)


def previous_attempts_store(port: int, attempt: int) -> dist.TCPStore:
    """What a rank 0 process of `attempt` serves on its port until it ends."""
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=True, wait_for_workers=False)
    store.set(ATTEMPT_KEY, str(attempt))
    return store


def test_a_rank_waits_out_the_store_rank_0s_previous_process_still_serves(tmp_path: Path) -> None:
    """InPlace: a kept rank 0's process of attempt 0 may still listen when rank 1's process of attempt 1
    arrives (forked in milliseconds); rank 1 must not join that gang, but the one of its attempt."""
    port = free_port()
    old = previous_attempts_store(port, 0)
    settings = {"DDP_ATTEMPT": "1", "WL_BATCH": "4", "WL_EPOCHS": "1", "DDP_PROGRESS_FILE": str(tmp_path / "progress")}
    command = [sys.executable, "-m", "ddp_trainer", "run", "ddp_workloads:train", "--"]
    said = tmp_path / "rank-1.err"
    with said.open("w") as err:
        rank1 = subprocess.Popen(command, env=rank_env(settings, 1, 2, port), stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_until(lambda: "still gathers attempt 0's gang" in said.read_text() or rank1.poll() is not None, 60,
                   "rank 1 at the store of attempt 0")
        assert rank1.poll() is None, said.read_text()[-3000:]
        del old  # the previous attempt's rank 0 process ends; this attempt's starts
        rank0 = subprocess.run(command, env=rank_env(settings, 0, 2, port), capture_output=True, text=True, timeout=120)
        assert rank0.returncode == 0, rank0.stderr[-3000:]
        assert rank1.wait(60) == 0, said.read_text()[-3000:]
    finally:
        rank1.kill()
        rank1.wait()
    assert "rank 1/2 joined (gloo on cpu)" in said.read_text()


def test_a_rank_of_an_attempt_the_store_has_passed_fails_at_once() -> None:
    port = free_port()
    store = previous_attempts_store(port, 2)
    settings = env.DistSettings.from_env({**rank_env({"DDP_INIT_TIMEOUT_SECONDS": "30"}, 1, 2, port)})
    started = time.monotonic()
    with pytest.raises(RendezvousError, match="gathers attempt 2's gang, not this rank's attempt 1"):
        gang_store(settings, 1)
    assert time.monotonic() - started < 10
    assert int(gang_store(settings, 2).get(ATTEMPT_KEY)) == 2
    del store
