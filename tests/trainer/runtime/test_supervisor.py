"""Pods of several ranks: the supervisor starts one process per local rank and fails the pod as a rank would."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch
from trainerhelp import ROOT, launch, rank_env
from trainerhelp import describe as _describe

from ddp_contract.failureline import parse_line
from ddp_trainer.errors import ExitCode
from ports import free_port


def launch_pods(target: str, pods: int, per_pod: int, extra_env: dict[str, str]) -> list[subprocess.CompletedProcess]:
    """Start `python -m ddp_trainer run` as the operator starts a pod of `per_pod` ranks: WORLD_SIZE,
    LOCAL_WORLD_SIZE and NODE_RANK, no RANK or LOCAL_RANK."""
    port = free_port()
    procs = []
    for pod in range(pods):
        env = rank_env(extra_env, 0, pods * per_pod, port)
        del env["RANK"], env["LOCAL_RANK"]
        env.update(LOCAL_WORLD_SIZE=str(per_pod), NODE_RANK=str(pod))
        procs.append(subprocess.Popen([sys.executable, "-m", "ddp_trainer", "run", target], env=env, cwd=ROOT,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return results


def test_two_pods_of_two_ranks_train_to_the_same_parameters_as_four_pods_of_one(tmp_path: Path) -> None:
    one_each, two_each = tmp_path / "one.pt", tmp_path / "two.pt"
    common = {"WL_BATCH": "4", "WL_EPOCHS": "2", "DDP_PROGRESS_FILE": str(tmp_path / "progress.json")}
    singles = launch("ddp_workloads:train", 4, {**common, "WL_OUT": str(one_each)})
    assert [r.returncode for r in singles] == [0] * 4, _describe(singles)
    pods = launch_pods("ddp_workloads:train", 2, 2, {**common, "WL_OUT": str(two_each)})
    assert [p.returncode for p in pods] == [0, 0], [p.stderr[-3000:] for p in pods]
    assert "started 2 local ranks (global 2, 3)" in pods[1].stderr
    expected, got = torch.load(one_each), torch.load(two_each)
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(expected[name], got[name]), name


def test_one_local_rank_failing_fails_its_pod_with_that_ranks_code_and_message(tmp_path: Path) -> None:
    message = tmp_path / "termination-log"
    message.touch()
    pods = launch_pods("ddp_workloads:fail_at_step", 1, 2, {"DDP_TERMINATION_MESSAGE_PATH": str(message),
                                                            "DDP_PROGRESS_FILE": str(tmp_path / "progress.json")})
    assert pods[0].returncode == ExitCode.USER_ERROR, pods[0].stderr[-3000:]
    line = parse_line(message.read_text())
    assert line is not None and line.rank == 1 and line.step == 3 and "a bug that fires at step 3" in line.error
