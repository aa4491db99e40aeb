"""The zygote of an InPlace pod: rank processes forked from a process that imported torch and the
runtime already, in real processes (gloo DDP, signals, exit codes)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch
from trainerhelp import describe, launch, rank_env

from ddp_trainer.errors import ExitCode
from ddp_trainer.runtime import zygote as zygote_module
from ddp_trainer.runtime.supervisor import LocalRanks
from ddp_trainer.runtime.zygote import ForkedProcess, Zygote
from kube import wait_until
from ports import free_port
from procs import parent_of


def ready(zygote: Zygote) -> Zygote:
    def said() -> bool:
        zygote.read()
        return zygote.ready

    wait_until(said, 60, "the zygote's imports")
    return zygote


@pytest.fixture
def zygote():
    found = ready(Zygote(rank_env({}, 0, 1, free_port())))
    yield found
    found.close()


def test_forked_local_ranks_train_as_ranks_started_anew(tmp_path: Path) -> None:
    fresh, forked = tmp_path / "fresh.pt", tmp_path / "forked.pt"
    common = {"WL_BATCH": "4", "WL_EPOCHS": "2", "DDP_PROGRESS_FILE": str(tmp_path / "progress.json")}
    singles = launch("ddp_workloads:train", 2, {**common, "WL_OUT": str(fresh)})
    assert [r.returncode for r in singles] == [0, 0], describe(singles)
    pod = rank_env({**common, "WL_OUT": str(forked), "LOCAL_WORLD_SIZE": "2", "NODE_RANK": "0"}, 0, 2, free_port())
    del pod["RANK"], pod["LOCAL_RANK"]
    with LocalRanks("ddp_workloads:train", [], pod) as ranks:
        ranks.prepare_zygote(pod)
        assert ranks.zygote is not None
        ready(ranks.zygote)
        ranks.start(pod)
        assert all(isinstance(r.process, ForkedProcess) for r in ranks.ranks)
        assert {parent_of(r.process.pid) for r in ranks.ranks} == {ranks.zygote.process.pid}
        assert not ranks.supervise()
        assert ranks.outcome() == (0, "")
    # Bit for bit on any CPU: both gangs run the same operations in the same order on this machine, one
    # thread a rank (rank_env), so only how the processes started differs.
    expected, got = torch.load(fresh), torch.load(forked)
    assert expected.keys() == got.keys() and all(torch.equal(expected[k], got[k]) for k in expected)


def test_a_forked_rank_makes_its_optimizers_and_clients_and_trains_a_step_importing_nothing(
        zygote: Zygote, tmp_path: Path) -> None:
    """What a first step imports would be paid by every restarted rank: torch._dynamo, which making an
    optimizer imports, took 1.1-2 s of it on 2 cores, the Kubernetes client 0.7 s."""
    env = rank_env({"WL_OUT": str(tmp_path / "imported.json")}, 0, 1, free_port())
    forked = zygote.fork("ddp_workloads:imports_of_a_first_step", [], env)
    assert forked is not None and forked.wait(60) == 0
    assert json.loads((tmp_path / "imported.json").read_text()) == []


def test_a_forked_rank_ends_with_its_own_code_and_its_signal_handling(zygote: Zygote, tmp_path: Path) -> None:
    (tmp_path / "message").touch()  # as the kubelet provides it
    env = rank_env({"DDP_TERMINATION_MESSAGE_PATH": str(tmp_path / "message")}, 0, 1, free_port())
    failed = zygote.fork("ddp_workloads:fail", [], env)
    assert failed is not None and failed.wait(60) == ExitCode.USER_ERROR
    assert "user code failed in rank 0" in (tmp_path / "message").read_text()

    waiting = zygote.fork("ddp_workloads:wait_for_sigterm", [],
                          {**env, "WL_READY_FILE": str(tmp_path / "ready"), "DDP_PROGRESS_FILE": str(tmp_path / "p")})
    assert waiting is not None
    wait_until(lambda: (tmp_path / "ready").exists() or waiting.poll() is not None, 60, "the rank in the user's code")
    waiting.send_signal(signal.SIGTERM)
    assert waiting.wait(30) == ExitCode.TERMINATED  # the runtime's own handler, as in a rank started anew


def test_without_its_zygote_a_pod_starts_its_ranks_anew(zygote: Zygote) -> None:
    zygote.process.kill()
    zygote.process.wait()
    assert zygote.fork("ddp_workloads:fail", [], rank_env({}, 0, 1, free_port())) is None


def test_a_child_forked_after_its_request_was_given_up_on_is_killed(zygote: Zygote, monkeypatch,
                                                                     tmp_path: Path) -> None:
    """A zygote too slow to answer (stopped here) has its rank started anew by the supervisor; the
    child it forks once it goes on would be a second process of that rank, and is killed."""
    monkeypatch.setattr(zygote_module, "ANSWER_WAIT_S", 0.5)
    os.kill(zygote.process.pid, signal.SIGSTOP)
    try:
        waits = {"WL_READY_FILE": str(tmp_path / "ready"), "DDP_PROGRESS_FILE": str(tmp_path / "progress")}
        assert zygote.fork("ddp_workloads:wait_for_sigterm", [], rank_env(waits, 0, 1, free_port())) is None
    finally:
        os.kill(zygote.process.pid, signal.SIGCONT)

    def late_child_ended() -> dict[int, int]:
        zygote.read()
        return zygote.ended

    try:
        ended = wait_until(late_child_ended, 30, "the late child's end")
        assert list(ended.values()) == [-signal.SIGKILL] and zygote.pids == []
    finally:
        for pid in zygote.pids:  # kept as a rank's (the failure this test is for): not left running
            os.kill(pid, signal.SIGKILL)
