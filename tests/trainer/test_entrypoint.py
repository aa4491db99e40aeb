"""The entrypoint in real processes: gloo process groups on loopback, exit codes, resume."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import ddp_workloads
import pytest
import torch
from trainerhelp import ROOT, free_port, launch, rank_env, workload_env
from trainerhelp import describe as _describe

from ddp_contract.failures import parse_line
from ddp_trainer.errors import ExitCode, ObjectNotFoundError
from ddp_trainer.storage import s3
from ddp_trainer.storage.checkpoint import CheckpointManager
from ddp_trainer.storage.results import read_metrics

WORLD = 2
BATCH = 4
EPOCHS = 2
STEPS = EPOCHS * ddp_workloads.SAMPLES // (WORLD * BATCH)


def _job_env(s3_env: dict[str, str], bucket: str, job: str, out: Path, **extra: str) -> dict[str, str]:
    return workload_env(s3_env, bucket, job, "team-a", out, BATCH, EPOCHS,
                        DDP_PROGRESS_FILE=str(out.parent / f"{job}-progress.json"),
                        DDP_PROGRESS_INTERVAL_SECONDS="0.5", **extra)


@pytest.fixture
def uninterrupted(s3_env, bucket, tmp_path):
    out = tmp_path / "uninterrupted.pt"
    results = launch("ddp_workloads:train", WORLD, _job_env(s3_env, bucket, "straight", out, WL_CKPT_EVERY="5"))
    assert [r.returncode for r in results] == [0] * WORLD, _describe(results)
    return torch.load(out), bucket, out


@pytest.mark.timeout(240)
def test_ddp_matches_single_process_and_resumes_after_kill(uninterrupted, s3_env, tmp_path) -> None:
    params, bucket, out = uninterrupted

    # DDP equivalence: N ranks with batch b == one process replaying their steps, but for rounding.
    ddp_workloads.assert_matches_reference(params, WORLD, BATCH, EPOCHS)
    assert not torch.allclose(params["0.weight"], ddp_workloads.model().state_dict()["0.weight"])  # it trained

    # The run left metrics, a result and progress behind.
    prefix = s3.S3Url(bucket, "runs/team-a/straight")
    metrics = read_metrics(prefix)
    assert sorted({m["rank"] for m in metrics}) == list(range(WORLD))
    assert sorted(m["step"] for m in metrics if m["rank"] == 0) == list(range(1, STEPS + 1))
    assert {"epoch", "loss", "time", "lr"} <= metrics[0].keys()
    assert s3.get_bytes(prefix.join("results", "final.txt")) == f"steps={STEPS}".encode()
    assert CheckpointManager(prefix, keep=2, rank=0).committed_steps() == [15, 20]
    progress = (out.parent / "straight-progress.json").read_text()
    assert f'"step": {STEPS}' in progress and '"samplesPerSecond"' in progress

    # Kill rank 0 (SIGKILL) right after an async save at step 10 was started; rank 1 then fails
    # in a collective and must exit with a retryable code.
    crashed_out = tmp_path / "resumed.pt"
    env = _job_env(s3_env, bucket, "crashy", crashed_out, WL_CKPT_EVERY="5", WL_CRASH_AT_STEP="10", WL_ASYNC="1")
    first = launch("ddp_workloads:train", WORLD, env)
    assert first[0].returncode == -9, _describe(first)
    assert first[1].returncode == ExitCode.COMMUNICATION_ERROR, _describe(first)
    assert "retryable" in first[1].stderr
    assert not crashed_out.exists()
    committed = CheckpointManager(s3.S3Url(bucket, "runs/team-a/crashy"), rank=0).committed_steps()
    assert committed and max(committed) in (5, 10)

    # Gang restart without the crash: resumes from the latest checkpoint, ends identical.
    env.pop("WL_CRASH_AT_STEP")
    second = launch("ddp_workloads:train", WORLD, env)
    assert [r.returncode for r in second] == [0] * WORLD, _describe(second)
    assert f"resumed from step {max(committed)}" in second[0].stdout
    resumed = torch.load(crashed_out)
    for name in params:
        assert torch.equal(resumed[name], params[name]), name


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


@pytest.mark.parametrize(
    ("target", "env", "message"),
    [
        ("ddp_workloads:train", {"WORLD_SIZE": ""}, "environment variable WORLD_SIZE is not set"),
        ("ddp_workloads:nope", {}, "module 'ddp_workloads' has no function 'nope'"),
        ("no_such_module:main", {}, "entrypoint module 'no_such_module' cannot be found"),
        ("ddp_workloads:train", {"DDP_BACKEND": "nccl"}, "DDP_BACKEND=nccl but this rank has no CUDA device"),
    ],
)
def test_bad_configuration_exits_2(target: str, env: dict[str, str], message: str) -> None:
    (result,) = launch(target, 1, env)
    assert result.returncode == ExitCode.CONFIG_ERROR, result.stderr
    assert message in result.stderr


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


def test_peer_death_in_collective_is_retryable() -> None:
    results = launch("ddp_workloads:use_collective", 2, {"DDP_INIT_TIMEOUT_SECONDS": "20"})
    assert results[1].returncode == 0
    assert results[0].returncode == ExitCode.COMMUNICATION_ERROR, _describe(results)


def test_operator_command_form_runs_ddp_entrypoint_with_args(tmp_path: Path) -> None:
    # `python -m ddp_trainer run -- ARGS`, target from DDP_ENTRYPOINT: here a script that checks
    # its argv and the process group, then exits with its own code.
    script = tmp_path / "job.py"
    script.write_text(
        "import sys, torch.distributed as dist\n"
        "import ddp_trainer\n"
        "assert dist.is_initialized() and dist.get_world_size() == 1, 'no process group'\n"
        "assert ddp_trainer.context().rank == 0\n"
        "print('argv', sys.argv[1:])\n"
        "sys.exit(int(sys.argv[-1]))\n"
    )
    (result,) = launch(None, 1, {"DDP_ENTRYPOINT": str(script)}, args=["--lr", "0.1", "3"])
    assert result.returncode == 3, result.stderr
    assert "argv ['--lr', '0.1', '3']" in result.stdout
    (missing,) = launch(None, 1, {})
    assert missing.returncode == ExitCode.CONFIG_ERROR
    assert "set DDP_ENTRYPOINT" in missing.stderr


@pytest.mark.parametrize("how", ["python -m ddp_trainer", "ddp-trainer console script"])
def test_a_failure_exits_with_the_runtimes_code_even_if_teardown_would_abort(how: str) -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, function = scripts["ddp-trainer"].split(":")
    start = (["-m", "ddp_trainer"] if how.startswith("python") else
             ["-c", f"import sys; sys.argv[0] = 'ddp-trainer'; from {module} import {function}; {function}()"])
    env = rank_env({}, 0, 1, free_port())
    result = subprocess.run([sys.executable, *start, "run", "ddp_workloads:fail_then_abort_at_exit"], env=env,
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == ExitCode.USER_ERROR, (result.returncode, result.stderr[-2000:])
    assert "the user's code failed" in result.stderr


def test_a_clean_run_exits_0_even_if_teardown_would_abort_after_its_threads_and_atexit_handlers(
        tmp_path: Path) -> None:
    out = tmp_path / "left.txt"
    (result,) = launch("ddp_workloads:succeed_then_abort_in_teardown", 1, {"WL_OUT": str(out)})
    assert result.returncode == ExitCode.OK, (result.returncode, result.stderr[-2000:])
    assert "rank 0 done" in result.stdout
    assert out.read_text() == "thread\natexit\n", "a clean exit waits for the user's threads, then runs atexit"


def test_a_rank_that_stops_calling_the_collective_is_caught_and_every_rank_dumps_its_stacks(
        s3_env, bucket, tmp_path: Path) -> None:
    env = {**s3_env, "DDP_RESULTS_URI": f"s3://{bucket}/runs", "DDP_JOB_NAME": "stuck", "DDP_JOB_NAMESPACE": "team-a",
           "DDP_ATTEMPT": "2", "DDP_HANG_TIMEOUT_SECONDS": "3", "DDP_PROGRESS_FILE": str(tmp_path / "progress.json")}
    started = time.monotonic()
    results = launch("ddp_workloads:hang", WORLD, env, timeout=90)
    assert [r.returncode for r in results] == [ExitCode.HUNG] * WORLD, _describe(results)
    assert time.monotonic() - started < 60
    hung = parse_line(results[1].stderr)
    assert hung is not None and hung.step == 3 and hung.exit_code == ExitCode.HUNG
    assert re.match(r"no progress for [34]s since step 3 \(hang timeout 3s\)", hung.error), hung.error
    dumps = s3.S3Url(bucket, "runs/team-a/stuck/hangs/attempt-2")
    assert f"stacks in s3://{bucket}/{dumps.key}/rank-1.txt" in hung.error
    stuck_in_sleep = s3.get_bytes(dumps.join("rank-1.txt")).decode()
    waiting_in_collective = s3.get_bytes(dumps.join("rank-0.txt")).decode()
    assert "time.sleep(3600)" in stuck_in_sleep and "in hang" in stuck_in_sleep
    assert "dist.all_reduce(torch.ones(1))" in waiting_in_collective


def test_sigterm_stops_a_rank_at_once_with_its_own_exit_code(tmp_path: Path) -> None:
    ready, message = tmp_path / "ready", tmp_path / "termination-log"
    message.touch()
    env = rank_env({"WL_READY_FILE": str(ready), "DDP_TERMINATION_MESSAGE_PATH": str(message),
                    "DDP_PROGRESS_FILE": str(tmp_path / "progress.json")}, 0, 1, free_port())
    proc = subprocess.Popen([sys.executable, "-m", "ddp_trainer", "run", "ddp_workloads:wait_for_sigterm"],
                            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), proc.communicate(timeout=10)
        sent = time.monotonic()
        proc.terminate()
        _, stderr = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert proc.returncode == ExitCode.TERMINATED == 143, stderr
    assert time.monotonic() - sent < 5
    line = parse_line(message.read_text())
    assert line is not None and line.step == 7 and "stopped by SIGTERM" in line.error


def test_a_rank_whose_master_resolves_but_does_not_listen_is_named() -> None:
    (result,) = launch("ddp_workloads:train", 2, {"DDP_MASTER_WAIT_SECONDS": "2"}, ranks=[1])
    assert result.returncode == ExitCode.RENDEZVOUS_FAILED, result.stderr
    line = parse_line(result.stderr)
    assert line is not None and line.rank == 1 and "rank 0 at 127.0.0.1:" in line.error
    assert "did not accept connections within 2s" in line.error


def test_the_gang_is_checked_with_an_all_reduce_before_user_code(s3_env, bucket, tmp_path: Path) -> None:
    results = launch("ddp_workloads:use_collective", 2, {"DDP_INIT_TIMEOUT_SECONDS": "20"})
    assert all("all-reduce check" in r.stderr for r in results), _describe(results)


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


def test_a_script_s_function_runs_with_the_modules_beside_it_and_the_context(tmp_path: Path) -> None:
    """`script.py:function` (what ddp_client.submit("train.py:train") ships): the script is imported,
    not run as __main__, the modules beside it import, and a one-argument function gets the context."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "helpers.py").write_text("def double(x):\n    return 2 * x\n")
    (code / "train.py").write_text(
        "import torch.distributed as dist\nimport helpers\n\n"
        "print('imported as', __name__)\n\n"
        "def train(ctx):\n"
        "    t = __import__('torch').tensor([float(helpers.double(ctx.rank + 1))])\n"
        "    dist.all_reduce(t)\n"
        "    print('sum', int(t.item()), 'rank', ctx.rank, flush=True)\n")
    results = launch(f"{code}/train.py:train", 2)
    assert [r.returncode for r in results] == [0, 0], _describe(results)
    for result in results:
        assert "imported as train" in result.stdout and f"sum 6 rank {result.rank}" in result.stdout
    (missing,) = launch(f"{code}/train.py:nope", 1)
    assert missing.returncode == ExitCode.CONFIG_ERROR
    assert f"script '{code}/train.py' has no function 'nope'" in missing.stderr


def test_the_last_step_reported_reaches_the_progress_sinks_when_the_function_returns(tmp_path: Path) -> None:
    """Reports come at most every DDP_PROGRESS_INTERVAL_SECONDS; the one held back at the end is not lost."""
    script = tmp_path / "quick.py"
    script.write_text(
        "from ddp_trainer import default_reporter\n\n"
        "def train():\n"
        "    progress = default_reporter()\n"
        "    for step in range(1, 6):\n"
        "        progress.report(epoch=0, step=step, loss=1.0 / step, samples=4)\n")
    progress_file = tmp_path / "progress.json"
    (result,) = launch(f"{script}:train", 1, {"DDP_PROGRESS_FILE": str(progress_file),
                                               "DDP_PROGRESS_INTERVAL_SECONDS": "3600"})
    assert result.returncode == 0, result.stderr
    assert json.loads(progress_file.read_text())["step"] == 5


def test_a_stalled_rank_saves_its_stacks_before_its_timeout_in_case_a_peer_s_ends_the_gang_first(
        s3_env, bucket, tmp_path: Path) -> None:
    """Halfway to its hang timeout a stalled rank saves its stacks without exiting; the pod deleted by
    a restart another rank's hang caused (here: SIGKILL) leaves them behind."""
    env = {**s3_env, "DDP_RESULTS_URI": f"s3://{bucket}/runs", "DDP_JOB_NAME": "stalled", "DDP_JOB_NAMESPACE": "team-a",
           "DDP_HANG_TIMEOUT_SECONDS": "30", "DDP_PROGRESS_FILE": str(tmp_path / "progress.json")}
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "ddp_trainer", "run", "ddp_workloads:hang"], cwd=ROOT,
                              env=rank_env(env, rank, WORLD, port), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True) for rank in range(WORLD)]
    dump = s3.S3Url(bucket, "runs/team-a/stalled/hangs/attempt-0/rank-1.txt")
    try:
        started = time.monotonic()
        while time.monotonic() - started < 60 and all(p.poll() is None for p in procs):
            try:
                saved = s3.get_bytes(dump).decode()
                break
            except ObjectNotFoundError:
                time.sleep(0.5)
        else:
            pytest.fail(f"no early dump of rank 1: {[p.poll() for p in procs]}")
        assert all(p.poll() is None for p in procs)  # saved ahead, not at the timeout: both still run
        assert "time.sleep(3600)" in saved and "in hang" in saved
    finally:
        for proc in procs:
            proc.kill()
        errors = [proc.communicate()[1] for proc in procs]
    assert "stacks saved ahead to s3://" in errors[1], errors[1][-2000:]
