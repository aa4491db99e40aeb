"""Leaving the process: the rank's exit code survives a teardown that would abort."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from trainerhelp import ROOT, launch, rank_env

from ddp_trainer.errors import ExitCode
from ports import free_port


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
