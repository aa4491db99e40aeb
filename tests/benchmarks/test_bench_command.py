"""The command benchmark (benchmarks/bench_command.py) stays runnable: a user's torchrun script as a
job's command, bare and under the trainer runtime, on a CPU with a small model, the runtime's progress
read off its bar checked. Not a timed test: it checks that both ways trained and were measured."""

from __future__ import annotations

import subprocess
import sys

from kube import REPO


def test_the_command_benchmark_runs_bare_and_under_the_runtime_on_a_cpu() -> None:
    argv = [sys.executable, str(REPO / "benchmarks" / "bench_command.py"), "--runs", "1", "--model", "resnet18",
            "--batch", "2", "--size", "32", "--steps", "6", "--warmup", "2"]
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    said = result.stdout
    assert "exec: " in said and "progress read: step 6," in said and "100.0%" in said, said
    rows = {line.split("|")[1].strip(): line for line in result.stdout.splitlines() if line.startswith("| ")}
    assert {"bare torchrun", "under the runtime"} <= rows.keys(), said
