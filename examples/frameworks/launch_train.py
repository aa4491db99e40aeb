"""A script launched with `python -m torch.distributed.launch`, as common notes on DDP set-up
run it, nothing of ddp-operator imported: the launcher passes --local-rank to each of
the pod's ranks and sets MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE.

    command: [python, -m, torch.distributed.launch, launch_train.py]

torch.distributed.launch takes --nproc_per_node, --nnodes, --node_rank, --master_addr and
--master_port from the pod's PET_* settings. Since torch 2.0 it passes `--local-rank=N`; a script that
parses only `--local_rank` must accept both, as torch's documentation says.
"""

from __future__ import annotations

import argparse
import hashlib
import json

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--local-rank", "--local_rank", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()
    dist.init_process_group(backend="gloo", init_method="env://")
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(1024, 16, generator=generator)
    dataset = TensorDataset(inputs, inputs.sum(dim=1, keepdim=True))
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for features, target in loader:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(features), target)
            loss.backward()
            optimizer.step()
        if dist.get_rank() == 0:
            print(f"epoch {epoch} (local rank {args.local_rank}): loss {loss.item():.4f}", flush=True)
    flat = torch.cat([p.detach().flatten() for p in model.module.parameters()]).numpy().tobytes()
    print(json.dumps({"event": "params", "rank": dist.get_rank(), "world_size": dist.get_world_size(),
                      "digest": hashlib.sha256(flat).hexdigest()}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
