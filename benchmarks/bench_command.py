"""What running a job's command under the trainer runtime costs a training step: `make bench-command`.

A user's torchrun script (resnet_torchrun.py: ResNet on synthetic images, DDP, a tqdm bar with the loss)
runs as a one-pod DDPJob's command would, with the environment the operator builds for the pod (PET_*
included, rank 0's address on loopback): bare (`torchrun SCRIPT`, an image without the runtime) and under
the runtime (`ddp-trainer exec -- torchrun SCRIPT`: its supervisor, output scanning, the hook in the
rank's interpreter), --runs times each, alternating. The figure is the script's own samples/s over its
timed steps. After each run under the runtime, the progress it read off the bar is checked: the step,
the loss and percent complete must be there, or the benchmark fails.

    make bench-command                                   # a GPU: nccl, resnet50, batch 128
    make bench-command BENCH_ARGS="--model resnet18 --batch 16 --size 64 --steps 40 --warmup 10"  # CPUs
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "resnet_torchrun.py"
sys.path[:0] = [str(REPO / p) for p in ("contract", "operator")]
from ddp_operator.manifests import build_pod, master_addr  # noqa: E402
from ddp_operator.spec import parse_spec  # noqa: E402

RUNTIME_PATH = os.pathsep.join(str(REPO / p) for p in ("images/trainer", "contract"))


def pod_env(script_args: Sequence[str], tmp: str) -> tuple[list[str], dict[str, str]]:
    """The pod's command and environment, as the operator builds them for a one-pod job."""
    job = {"apiVersion": "ddp.example.com/v1", "kind": "DDPJob",
           "metadata": {"name": "bench", "namespace": "default", "uid": "bench"},
           "spec": {"image": "unused", "worldSize": 1, "command": ["torchrun", str(SCRIPT), *script_args]}}
    spec = parse_spec(job["spec"])
    container = build_pod(job, spec, 0, 0)["spec"]["containers"][0]
    master = master_addr("bench", "default")
    port = str(free_port())
    env = {e["name"]: ("127.0.0.1" if e.get("value") == master else e["value"]) for e in container["env"] if "value" in e}
    env.update(MASTER_PORT=port, PET_MASTER_PORT=port, DDP_PROGRESS_FILE=f"{tmp}/progress.json",
               PYTHONPATH=os.pathsep.join([RUNTIME_PATH, os.environ.get("PYTHONPATH", "")]),
               PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    for name in ("HOME", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS"):
        if name in os.environ:
            env[name] = os.environ[name]
    return [*job["spec"]["command"]], env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def one_run(via: str, script_args: Sequence[str], tmp: str) -> dict[str, Any]:
    out = f"{tmp}/speed.json"
    command, env = pod_env([*script_args, "--out", out], tmp)
    argv = command if via == "bare" else [sys.executable, "-m", "ddp_trainer", "exec", "--", *command]
    started = time.monotonic()
    proc = subprocess.run(argv, env=env, cwd=tmp, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{via} exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-4000:]}")
    with open(out) as f:
        result: dict[str, Any] = json.load(f)
    result["wall_s"] = time.monotonic() - started
    if via == "exec":
        result["progress"] = read_progress(f"{tmp}/progress.json", proc.stderr)
    return result


def read_progress(path: str, said: str) -> dict[str, Any]:
    """The runtime's last progress record; it must hold the bar's step, loss and percent."""
    try:
        with open(path) as f:
            record: dict[str, Any] = json.load(f)
    except OSError as e:
        raise RuntimeError(f"the runtime wrote no progress ({e}):\n{said[-3000:]}") from e
    missing = [k for k in ("step", "loss", "percent") if record.get(k) is None]
    if missing:
        raise RuntimeError(f"the runtime's progress lacks {missing}: {record}")
    os.unlink(path)
    return record


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs each way, alternating")
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batch", default="128")
    parser.add_argument("--size", default="224")
    parser.add_argument("--steps", default="300")
    parser.add_argument("--warmup", default="30")
    args = parser.parse_args(argv)
    script_args = ["--model", args.model, "--batch", args.batch, "--size", args.size,
                   "--steps", args.steps, "--warmup", args.warmup]
    import torch

    where = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"{os.cpu_count()} CPUs"
    print(f"[command] {args.model}, batch {args.batch}, {args.size}px, {args.steps} steps ({args.warmup} untimed), "
          f"{where}, torch {torch.__version__}, {args.runs} runs each way; {time.strftime('%Y-%m-%d')}", flush=True)
    speeds: dict[str, list[float]] = {"bare": [], "exec": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            for via in ("bare", "exec") if i % 2 == 0 else ("exec", "bare"):
                result = one_run(via, script_args, tmp)
                speeds[via].append(result["samples_per_s"])
                seen = result.get("progress")
                print(f"  {via}: {result['samples_per_s']:.1f} samples/s, {result['step_ms']:.2f} ms a step, "
                      f"{result['wall_s']:.1f} s in all" + (f"; progress read: step {seen['step']}, loss {seen['loss']}, "
                                                           f"{seen['percent']}%" if seen else ""), flush=True)
    bare, under = statistics.median(speeds["bare"]), statistics.median(speeds["exec"])
    print("| command | samples/s (median) | step ms | vs bare |\n|---|---|---|---|")
    batch = int(args.batch)
    for via, speed in (("bare torchrun", bare), ("under the runtime", under)):
        print(f"| {via} | {speed:.1f} | {1000 * batch / speed:.2f} | {speed / bare:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
