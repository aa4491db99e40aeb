"""A user's torchrun script, nothing of ours imported: the command `bench_command.py` times bare and under
the trainer runtime. ResNet on synthetic images, DDP (nccl on a GPU, gloo on CPUs), bf16 autocast on a
GPU, a tqdm bar with the loss as its postfix, as such scripts are written.

    torchrun --standalone --nproc_per_node=1 benchmarks/resnet_torchrun.py --steps 300 --out speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--size", type=int, default=224, help="image side in pixels")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30, help="steps left out of the timing")
    parser.add_argument("--out", help="where rank 0 writes its samples/s as JSON")
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    torch.manual_seed(0)
    model = getattr(torchvision.models, args.model)(num_classes=1000).to(device, memory_format=torch.channels_last)
    model = DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    images = torch.randn(args.batch, 3, args.size, args.size, device=device).to(memory_format=torch.channels_last)
    labels = torch.randint(0, 1000, (args.batch,), device=device)

    rank0 = dist.get_rank() == 0
    started = 0.0
    with tqdm(total=args.steps, desc="train", disable=not rank0) as bar:
        for step in range(args.steps):
            if step == args.warmup:
                if cuda:
                    torch.cuda.synchronize()
                started = time.perf_counter()
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step % 10 == 0:
                bar.set_postfix(loss=f"{loss.item():.3f}")
            bar.update()
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - started
    if rank0 and args.out:
        timed = args.steps - args.warmup
        with open(args.out, "w") as f:
            json.dump({"samples_per_s": timed * args.batch * dist.get_world_size() / elapsed,
                       "step_ms": 1000 * elapsed / timed, "world_size": dist.get_world_size()}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
