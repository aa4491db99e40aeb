"""A job's command under the trainer runtime (`python -m ddp_trainer exec -- CMD`), in real processes:
what it prints passes through and is kept, how it failed becomes the pod's exit code and last words
(from the failing Python process itself where a launcher hides it), a process group of the wrong size
fails saying why, a hang is caught with every process's stacks, SIGTERM stops the command's processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Mapping
from pathlib import Path

import pytest
from trainerhelp import rank_env

from ddp_contract import layout
from ddp_contract.failureline import parse_line
from ddp_trainer.runtime.command import code_name, last_error, launch_argv
from ddp_trainer.storage import s3
from ddp_trainer.storage.results import read_metrics
from ports import free_port
from waiting import wait_until


def exec_command(command: list[str], tmp_path: Path, extra: Mapping[str, str] | None = None, world_size: int = 1,
                 rank: int = 0, port: int | None = None) -> subprocess.Popen[str]:
    message = tmp_path / f"termination-{rank}"
    message.write_text("")  # the kubelet makes the file; the runtime writes it only where it exists
    env = rank_env({"DDP_TERMINATION_MESSAGE_PATH": str(message), "DDP_JOB_NAME": "cmd", **(extra or {})}, rank,
                   world_size, port or free_port())
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    return subprocess.Popen([sys.executable, "-m", "ddp_trainer", "exec", "--", *command], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finished(proc: subprocess.Popen[str], timeout: float = 120) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_a_command_s_output_passes_through_and_is_kept_in_s3(tmp_path: Path, s3_env, bucket) -> None:
    train = script(tmp_path, "train.py", """
        import sys
        for step in range(1, 4):
            print({"loss": 1 / step, "step": step}, flush=True)
        print("a warning", file=sys.stderr)
        """)
    code, out, err = finished(exec_command(["python", train], tmp_path, {**s3_env, "DDP_RESULTS_URI": f"s3://{bucket}/runs"}))
    assert code == 0, err
    assert out.splitlines() == [f"{{'loss': {1 / s}, 'step': {s}}}" for s in range(1, 4)] and "a warning" in err
    prefix = s3.S3Url(bucket, "runs/default/cmd")
    kept = s3.get_bytes(prefix.join(layout.log_part(0, 0, 0))).decode()
    assert "{'loss': 0.5, 'step': 2}" in kept and "a warning" in kept
    assert [r["step"] for r in read_metrics(prefix)] == [1, 2, 3]  # the printed metric lines, as an entrypoint's


def test_a_python_failure_is_the_pod_s_with_its_step_and_error_and_the_traceback_s_end(tmp_path: Path) -> None:
    train = script(tmp_path, "train.py", """
        for step in range(1, 4):
            print({"loss": 1.0, "step": step}, flush=True)
        raise ValueError("the learning rate is negative")
        """)
    code, _, err = finished(exec_command(["python", train], tmp_path))
    line = parse_line(err)
    assert code == 1 and line is not None, err
    assert (line.rank, line.step, line.exit_code, line.error) == (0, 3, 1, "ValueError: the learning rate is negative")
    message = (tmp_path / "termination-0").read_text()
    assert 'raise ValueError("the learning rate is negative")' in message and message.endswith(err.splitlines()[-1])


def test_a_broken_collective_under_torchrun_is_the_infrastructure_s_not_torchrun_s_exit_1(tmp_path: Path) -> None:
    train = script(tmp_path, "train.py", """
        import torch.distributed as dist
        raise dist.DistNetworkError("Connection reset by peer")
        """)
    code, _, err = finished(exec_command(["torchrun", "--nnodes=1", "--nproc-per-node=1", train], tmp_path))
    line = parse_line(err)
    assert code == 202 and line is not None and line.exit_code == 202, err  # COMMUNICATION_ERROR: retried
    assert "ChildFailedError" in err  # torchrun's own report is still there, above


def test_a_command_that_is_no_python_fails_with_its_code_and_its_last_line(tmp_path: Path) -> None:
    code, _, err = finished(exec_command(["sh", "-c", "echo starting; echo 'no GPU found' >&2; exit 3"], tmp_path))
    line = parse_line(err)
    assert code == 3 and line is not None and (line.exit_code, line.error) == (3, "no GPU found"), err
    code, _, err = finished(exec_command(["sh", "-c", "kill -KILL $$"], tmp_path))
    assert code == 137 and "exit 137 SIGKILL, retryable" in err.splitlines()[-1]


def test_a_process_group_of_another_size_than_the_gang_fails_saying_why(tmp_path: Path) -> None:
    # The job's gang is two ranks; the script forms a group of its own: it would train a model alone.
    train = script(tmp_path, "train.py", f"""
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{free_port()}", world_size=1, rank=0)
        print("trained alone")
        """)
    code, out, err = finished(exec_command(["python", train], tmp_path, world_size=2, rank=0))
    line = parse_line(err)
    assert code == 2 and line is not None and "trained alone" not in out, err
    assert "joined a process group of 1 rank, but the job's gang has 2" in line.error


def test_a_gang_of_two_command_pods_forms_and_rank_0_says_so(tmp_path: Path) -> None:
    train = script(tmp_path, "train.py", """
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        total = torch.ones(1)
        dist.all_reduce(total)
        print(f"rank {dist.get_rank()} of {dist.get_world_size()}: {int(total.item())}", flush=True)
        dist.destroy_process_group()
        """)
    port = free_port()
    procs = [exec_command(["python", train], tmp_path, world_size=2, rank=rank, port=port) for rank in (0, 1)]
    results = [finished(proc) for proc in procs]
    assert [r[0] for r in results] == [0, 0], results
    assert [r[1].strip() for r in results] == ["rank 0 of 2: 2", "rank 1 of 2: 2"]
    assert "attempt 0: rank 0's process group formed" in results[0][2]


def test_a_hung_command_prints_every_process_s_stacks_and_ends_hung(tmp_path: Path) -> None:
    train = script(tmp_path, "train.py", """
        import subprocess, sys, time
        helper_code = "import time\\ndef helper_waits():\\n    time.sleep(600)\\nhelper_waits()"
        helper = subprocess.Popen([sys.executable, "-c", helper_code])
        def waits_for_a_peer():
            time.sleep(600)
        print({"loss": 1.0, "step": 1}, flush=True)
        waits_for_a_peer()
        """)
    started = time.monotonic()
    code, _, err = finished(exec_command(["python", train], tmp_path, {"DDP_HANG_TIMEOUT_SECONDS": "3"}), timeout=60)
    line = parse_line(err)
    assert code == 204 and line is not None and line.step == 1, err
    assert "waits_for_a_peer" in err and "helper_waits" in err  # the stacks of both Python processes
    assert time.monotonic() - started < 30


def test_sigterm_stops_the_command_and_every_process_it_started(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    train = script(tmp_path, "train.py", f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        time.sleep(600)
        """)
    proc = exec_command(["python", train], tmp_path)
    def child_started() -> bool:
        assert proc.poll() is None, "the command ended before it started its child"
        return pid_file.exists() and bool(pid_file.read_text())

    wait_until(child_started, 60, "the command to start its child", interval=0.1)
    proc.send_signal(signal.SIGTERM)
    code, _, err = finished(proc, timeout=30)
    assert code == 143 and "stopped by SIGTERM" in err
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


def test_a_program_of_a_pod_of_several_ranks_runs_under_torchrun_a_launcher_or_a_self_starter_as_it_is(tmp_path: Path) -> None:
    env = {"LOCAL_WORLD_SIZE": "2", "PATH": str(Path(sys.executable).parent),  # where this venv's torchrun is
           "PET_NNODES": "3", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "job-0.job.ns.svc", "PET_MASTER_PORT": "23456"}
    assert launch_argv(["python", "train.py"], env)[1:] == [
        "--nnodes=3", "--nproc-per-node=2", "--node-rank=1", "--master-addr=job-0.job.ns.svc", "--master-port=23456",
        "--no-python", "python", "train.py"]
    assert launch_argv(["torchrun", "train.py"], env) == ["torchrun", "train.py"]
    assert launch_argv(["python", "spawn.py"], {**env, "DDP_LAUNCHER": "Command"}) == ["python", "spawn.py"]
    (tmp_path / "run.sh").write_text("#!/bin/sh\naccelerate launch train.py\n")
    assert launch_argv(["sh", str(tmp_path / "run.sh")], env) == ["sh", str(tmp_path / "run.sh")]  # read in the pod
    assert launch_argv(["python", "train.py"], {"LOCAL_WORLD_SIZE": "1"}) == ["python", "train.py"]


def test_the_last_error_of_a_command_s_output() -> None:
    worker = "Traceback (most recent call last):\n  File \"t.py\", line 1\nRuntimeError: boom\n"
    launcher = ("Traceback (most recent call last):\n  File \"run.py\"\n"
                "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n====\nt.py FAILED\n")
    assert last_error(worker + launcher) == "RuntimeError: boom"
    prefixed = "[rank1]: Traceback (most recent call last):\n[rank1]:   File \"x\"\n[rank1]: KeyError: 'a'\n"
    assert last_error(prefixed) == "KeyError: 'a'"
    assert last_error("loading\nout of memory\n\n") == "out of memory"
    assert last_error("") == "the command printed nothing"
    assert [code_name(c) for c in (1, 2, 137, 143, 204, 77, 250)] == ["USER_ERROR", "CONFIG_ERROR", "SIGKILL", "TERMINATED",
                                                                      "HUNG", "EXIT", "EXIT"]
