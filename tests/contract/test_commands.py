"""Which commands are the runtime, a launcher of the pod's ranks, or one rank's program."""

from __future__ import annotations

import pytest

from ddp_contract.commands import LAUNCHER, PROGRAM, RUNTIME, command_kind


@pytest.mark.parametrize("argv", [
    ["torchrun", "train.py"],
    ["/usr/local/bin/torchrun", "--nnodes=2", "train.py"],
    ["python", "-m", "torch.distributed.launch", "--nproc_per_node=2", "main.py"],
    ["python3.11", "-u", "-m", "torch.distributed.run", "train.py"],
    ["python", "-X", "faulthandler", "-mtorch.distributed.run", "train.py"],
    ["accelerate", "launch", "--multi_gpu", "train.py"],
    ["accelerate-launch", "train.py"],
    ["deepspeed", "train.py"],
    ["env", "NCCL_DEBUG=INFO", "torchrun", "train.py"],
    ["bash", "-c", "pip install -r requirements.txt && torchrun train.py --epochs 3"],
    ["sh", "-ec", "exec python -m torch.distributed.run train.py"],
    ["bash", "-lc", "accelerate  launch train.py"],
])
def test_launchers_are_known_where_and_however_they_are_named(argv: list[str]) -> None:
    assert command_kind(argv) == LAUNCHER


@pytest.mark.parametrize("argv", [
    ["python", "train.py"],
    ["python", "-c", "import torch"],
    ["python", "-m", "my_package.train"],
    ["./train.sh"],
    ["bash", "-c", "python train.py  # not torchrunner"],
    ["sh", "train.sh"],  # a script file: the operator cannot look into it
    ["accelerate", "config"],
    ["torchrun_helper", "train.py"],
])
def test_anything_else_is_one_rank_s_program(argv: list[str]) -> None:
    assert command_kind(argv) == PROGRAM


@pytest.mark.parametrize("argv", [
    ["python", "-m", "ddp_trainer", "run", "train.py", "--"],  # as ddp_client ships a script
    ["/opt/ddp/bin/ddp-trainer", "exec", "--", "python", "train.py"],
    ["sh", "-c", "cd /work && python -m ddp_trainer run train:main"],
])
def test_the_runtime_itself_is_known(argv: list[str]) -> None:
    assert command_kind(argv) == RUNTIME


def test_the_pod_s_side_looks_into_a_shell_script_the_command_runs() -> None:
    scripts = {"launch.sh": "#!/bin/sh\nset -e\ntorchrun --nproc-per-node=$PET_NPROC_PER_NODE train.py\n",
               "plain.sh": "#!/bin/sh\npython train.py\n"}
    assert command_kind(["bash", "launch.sh"], read=scripts.get) == LAUNCHER
    assert command_kind(["bash", "-x", "plain.sh"], read=scripts.get) == PROGRAM
    assert command_kind(["bash", "missing.sh"], read=scripts.get) == PROGRAM
