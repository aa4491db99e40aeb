"""A command job's pods as local processes: each runs what its container would under the trainer
runtime (`python -m ddp_trainer exec -- CMD...`) with the environment the operator builds for it (the
PET_* settings included), rank 0's address moved to loopback. The process tier of the command-job tests:
real launchers, real process groups, the runtime from the source tree, no image to build."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddp_operator.manifests import build_pod, master_addr
from ddp_operator.spec import parse_spec
from kube import REPO

RUNTIME_PATH = [str(REPO / "images" / "trainer"), str(REPO / "contract")]


@dataclass
class PodRun:
    index: int
    code: int
    output: str  # stdout and stderr, in order


def pod_env(job: Mapping[str, Any], index: int, port: int, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Pod `index`'s trainer env as the operator builds it (plain values only), on loopback."""
    meta = job["metadata"]
    spec = parse_spec(job["spec"])
    container = build_pod(job, spec, index, 0)["spec"]["containers"][0]
    master = master_addr(meta["name"], meta["namespace"])
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env = {k: ("127.0.0.1" if v == master else v) for k, v in env.items()}
    for name in ("MASTER_PORT", "PET_MASTER_PORT"):
        env[name] = str(port)
    path = os.pathsep.join([*RUNTIME_PATH, os.environ.get("PYTHONPATH", "")])
    # A pod's /tmp is its own; these pods share the host's, so they write the test's file (conftest's).
    progress_file = {k: v for k, v in os.environ.items() if k == "DDP_PROGRESS_FILE"}
    return {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"),
            "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
            **progress_file, **env, **(extra or {})}


def command_of(job: Mapping[str, Any]) -> list[str]:
    spec = job["spec"]
    return [*spec["command"], *spec.get("args", [])]


def start_pods(job: Mapping[str, Any], port: int, cwd: Path, extra: Mapping[str, str] | None = None,
               indices: Sequence[int] | None = None) -> list[subprocess.Popen[str]]:
    spec = parse_spec(job["spec"])
    return [subprocess.Popen([sys.executable, "-m", "ddp_trainer", "exec", "--", *command_of(job)],
                             env=pod_env(job, index, port, extra), cwd=cwd, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
            for index in (range(spec.pods) if indices is None else indices)]


def run_pods(job: Mapping[str, Any], port: int, cwd: Path, extra: Mapping[str, str] | None = None,
             timeout: float = 300) -> list[PodRun]:
    procs = start_pods(job, port, cwd, extra)
    runs = []
    try:
        for index, proc in enumerate(procs):
            output, _ = proc.communicate(timeout=timeout)
            runs.append(PodRun(index, proc.returncode, output))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return runs


def command_job(name: str, command: Sequence[str], **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}"},
            "spec": {"worldSize": 2, "gpusPerRank": 0, "image": "trainer:1", "command": list(command), **spec}}
