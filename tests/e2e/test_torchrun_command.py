"""A `command` job with ranksPerPod > 1 in an image without the trainer runtime: the operator's torchrun
line, run as two pods would run it, with nothing but the pods' PET_* settings to say the job's world."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ddp_operator.manifests import build_pod
from ddp_operator.spec import parse_spec
from kube import REPO
from trainer.trainerhelp import free_port

SCRIPT = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank())])
dist.all_reduce(total)
print(f"rank={os.environ['RANK']} local={os.environ['LOCAL_RANK']} group={os.environ['GROUP_RANK']} "
      f"world={dist.get_world_size()} sum={int(total.item())}", flush=True)
dist.destroy_process_group()
"""


def test_two_pods_of_two_ranks_run_the_users_command_under_torchrun() -> None:
    job = {"metadata": {"name": "cmd", "namespace": "team", "uid": "u"},
           "spec": {"worldSize": 4, "ranksPerPod": 2, "gpusPerRank": 0, "image": "pytorch:2", "trainerRuntime": "Off",
                    "command": ["python", "-c", SCRIPT]}}
    spec, port = parse_spec(job["spec"]), free_port()
    procs = []
    for index in range(spec.pods):
        trainer = build_pod(job, spec, index, 0)["spec"]["containers"][0]
        assert trainer["command"] == ["torchrun", "--no-python", "python", "-c", SCRIPT]
        command = [sys.executable, "-m", "torch.distributed.run", *trainer["command"][1:]]
        # `python` in the command is this venv's, as it would be the image's.
        env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
        env |= {e["name"]: e["value"] for e in trainer["env"] if "value" in e}
        # This machine is both pods: rank 0's address is loopback, not its cluster DNS name.
        env |= {"PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port)}
        procs.append(subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
        outputs += [line for line in out.splitlines() if line.startswith("rank=")]
    assert sorted(outputs) == [f"rank={r} local={r % 2} group={r // 2} world=4 sum=6" for r in range(4)]
