"""The quick-start job (`examples/ddpjob.yaml`): DDP on data it makes itself, no S3 and no GPU needed.

Every rank generates the same synthetic task (points around 8 centres in 16 dimensions, with
noise; the label is the centre a point was drawn around), trains a small MLP on its DistributedSampler share,
reports epoch/step/loss to the job's status from rank 0 and prints the held-out accuracy at the
end, which is far above the 12.5% of guessing.

    python -m ddp_trainer run quickstart:main -- --epochs 8
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ddp_trainer import RankContext, default_reporter

CLASSES = 8
FEATURES = 16


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="quickstart")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4096, help="training samples, all ranks together")
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--lr", type=float, default=0.005)
    parser.add_argument("--seed", type=int, default=0, help="initial weights and data order (the task stays the same)")
    return parser.parse_args(argv)


def make_task(samples: int, seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    """The same train and test sets on every rank (seeded), so the sampler can split them."""
    generator = torch.Generator().manual_seed(seed)
    centres = torch.randn(CLASSES, FEATURES, generator=generator)

    def draw(count: int) -> TensorDataset:
        labels = torch.randint(0, CLASSES, (count,), generator=generator)
        points = centres[labels] + torch.randn(count, FEATURES, generator=generator)
        return TensorDataset(points, labels)

    return draw(samples), draw(max(samples // 4, CLASSES))


def accuracy(model: nn.Module, data: TensorDataset, device: torch.device) -> float:
    points, labels = (t.to(device) for t in data.tensors)
    with torch.no_grad():
        return (model(points).argmax(dim=1) == labels).float().mean().item()


def main(ctx: RankContext) -> None:
    args = parse_args(sys.argv[1:])
    torch.manual_seed(args.seed)  # the same initial weights everywhere (DDP broadcasts rank 0's anyway)
    train, test = make_task(args.samples)
    sampler: DistributedSampler[tuple[torch.Tensor, ...]] = DistributedSampler(
        train, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=args.seed)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)
    device = torch.device(ctx.device)
    model = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, CLASSES)).to(device)
    ddp = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    reporter = default_reporter(ctx.rank, total_steps=args.epochs * len(loader))
    print(f"rank {ctx.rank}/{ctx.world_size}: accuracy before training {accuracy(model, test, device):.3f}", flush=True)
    step = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for points, labels in loader:
            points, labels = points.to(device), labels.to(device)
            optimizer.zero_grad()
            loss = loss_fn(ddp(points), labels)
            loss.backward()
            optimizer.step()
            step += 1
            # The loss averaged over the gang, so the status shows the job's loss, not rank 0's.
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            reporter.report(epoch=epoch, step=step, loss=mean / ctx.world_size, samples=len(labels) * ctx.world_size)
        if ctx.rank == 0:
            print(f"epoch {epoch}: loss {(mean / ctx.world_size).item():.4f}", flush=True)
    reporter.flush()
    print(f"rank {ctx.rank}/{ctx.world_size}: accuracy after training {accuracy(model, test, device):.3f}", flush=True)
