"""The mp.spawn pattern of the notes on DDP set-up (pytorch/examples' imagenet main.py), nothing of
ddp-operator imported: one process per pod starts its ranks itself with torch.multiprocessing.spawn and
each joins with an explicit rank and world size.

    command: [sh, -c, 'python spawn_train.py --dist-url tcp://$MASTER_ADDR:$MASTER_PORT --world-size $PET_NNODES
              --rank $NODE_RANK --multiprocessing-distributed --nprocs $LOCAL_WORLD_SIZE']

--world-size and --rank are the nodes' (pods'), as the notes pass them; the script multiplies them by the
ranks of a pod, as main.py does.
"""

from __future__ import annotations

import argparse
import hashlib
import json

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main_worker(gpu: int, ngpus_per_node: int, args: argparse.Namespace) -> None:
    args.rank = args.rank * ngpus_per_node + gpu
    dist.init_process_group(backend="gloo", init_method=args.dist_url, world_size=args.world_size, rank=args.rank)
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(1024, 8, generator=generator)
    dataset = TensorDataset(inputs, (inputs[:, 0] > 0).long())
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    model = nn.parallel.DistributedDataParallel(nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for features, labels in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(features), labels).backward()
            optimizer.step()
    flat = torch.cat([p.detach().flatten() for p in model.module.parameters()]).numpy().tobytes()
    print(json.dumps({"event": "params", "rank": dist.get_rank(), "world_size": dist.get_world_size(),
                      "digest": hashlib.sha256(flat).hexdigest()}), flush=True)
    # No rank starts to exit while another still works: gloo's threads let go of the backward pass's
    # last all-reduces while the barrier waits (they need the GIL, which an exiting interpreter no
    # longer hands out: the process would abort with "terminate called without an active exception").
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dist-url", required=True)
    parser.add_argument("--world-size", type=int, required=True, help="number of nodes")
    parser.add_argument("--rank", type=int, required=True, help="node rank")
    parser.add_argument("--nprocs", type=int, default=1, help="ranks per node (GPUs: torch.cuda.device_count())")
    parser.add_argument("--multiprocessing-distributed", action="store_true")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    if args.multiprocessing_distributed:
        args.world_size = args.nprocs * args.world_size
        mp.spawn(main_worker, nprocs=args.nprocs, args=(args.nprocs, args))
    else:
        main_worker(0, 1, args)


if __name__ == "__main__":
    main()
