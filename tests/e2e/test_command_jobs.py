"""Command jobs as users write them, each pod a local process under the trainer runtime with the env the
operator builds (tests/commandpods.py): torchrun, torch.distributed.launch and the mp.spawn pattern, one
rank a pod and several, each train one model across the gang: every rank ends with the same parameters
(a digest of their bytes: DDP keeps the replicas identical, its all-reduce gives every rank the same
sums) and a world of the job's size. A launcher inside a launcher fails at once, saying why."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from commandpods import PodRun, command_job, run_pods
from ddp_contract.failureline import parse_line
from kube import REPO
from trainer.trainerhelp import free_port

FRAMEWORKS = REPO / "examples" / "frameworks"
PARAMS = re.compile(r'\{"event": "params"[^}]*\}')


def params(runs: list[PodRun]) -> list[dict[str, Any]]:
    assert [run.code for run in runs] == [0] * len(runs), "\n".join(run.output[-3000:] for run in runs)
    return [json.loads(found) for run in runs for found in PARAMS.findall(run.output)]


def assert_one_model(found: list[dict[str, Any]], world: int) -> None:
    assert sorted(p["rank"] for p in found) == list(range(world))
    assert {p["world_size"] for p in found} == {world}
    assert len({p["digest"] for p in found}) == 1, found


@pytest.mark.parametrize("per_pod", [1, 2])
def test_a_torchrun_script_trains_one_model_across_the_pods(per_pod: int, tmp_path: Path) -> None:
    job = command_job("tr", ["torchrun", "torchrun_train.py", "2", "1", "--batch_size", "64"], worldSize=4,
                      ranksPerPod=per_pod)
    assert_one_model(params(run_pods(job, free_port(), FRAMEWORKS)), 4)


def test_a_torch_distributed_launch_script_gets_its_local_rank_and_the_job_s_world(tmp_path: Path) -> None:
    job = command_job("tl", ["python", "-m", "torch.distributed.launch", "launch_train.py", "--epochs", "2"],
                      worldSize=4, ranksPerPod=2)
    assert_one_model(params(run_pods(job, free_port(), FRAMEWORKS)), 4)


def test_the_mp_spawn_pattern_starts_the_pod_s_ranks_itself(tmp_path: Path) -> None:
    line = ("python spawn_train.py --dist-url tcp://$MASTER_ADDR:$MASTER_PORT --world-size $PET_NNODES "
            "--rank $NODE_RANK --multiprocessing-distributed --nprocs $LOCAL_WORLD_SIZE --epochs 2")
    job = command_job("ts", ["sh", "-c", line], worldSize=4, ranksPerPod=2, launcher="Command")
    assert_one_model(params(run_pods(job, free_port(), FRAMEWORKS)), 4)


def test_a_launcher_inside_a_launcher_fails_at_once_saying_why(tmp_path: Path) -> None:
    # The runtime cannot see into this script: it runs it under torchrun, whose copies each start one more.
    (tmp_path / "train.sh").write_text(f"#!/bin/sh\nexec torchrun --nnodes=1 --nproc-per-node=1 "
                                       f"{FRAMEWORKS / 'torchrun_train.py'} 2 1\n")
    (tmp_path / "train.sh").chmod(0o755)
    job = command_job("tn", ["./train.sh"], worldSize=4, ranksPerPod=2)
    runs = run_pods(job, free_port(), tmp_path, timeout=180)
    for run in runs:
        line = parse_line(run.output)
        assert run.code == 2 and line is not None, run.output[-3000:]
        assert "joined a process group of 1 rank, but the job's gang has 4" in line.error
