"""The GPU training benchmark (benchmarks/bench_train.py) stays runnable: its whole code path (shards
in S3, ShardStream in DataLoader workers, the model's step) on a CPU with a small model. Not a timed
test: it checks that both feeds trained and were measured, not how fast."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from kube import REPO


def test_the_training_benchmark_runs_both_feeds_on_a_cpu(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    argv = [sys.executable, str(REPO / "benchmarks" / "bench_train.py"), "--device", "cpu", "--model", "resnet18",
            "--batch", "4", "--image-size", "32", "--steps", "2", "--warmup", "1", "--workers", "2", "--json", str(out)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["model"] == "resnet18" and report["device"].startswith("CPU")
    for feed in ("synthetic", "shard-stream"):
        assert report[feed]["images_per_s"] > 0 and report[feed]["seconds"] > 0, report
    assert report["ratio"] == report["shard-stream"]["images_per_s"] / report["synthetic"]["images_per_s"]
    assert "shard-stream / synthetic = " in result.stdout and "(target >= 0.9)" in result.stdout
