"""Example DDPJob entrypoint: image classification from $DDP_DATASET_URI.

Run in every rank as ``python -m ddp_trainer run train_classifier:main -- --epochs 3``.
The dataset URI may be an image folder (s3://bucket/train) or a shard index
(s3://bucket/shards/index.json, see `python -m ddp_trainer make-shards`). Resumes from the
job's latest checkpoint after a gang restart, logs per-rank metrics and rank-0 progress.
Rank 0 prints the gang's mean loss per epoch and, with ``--holdout-every N`` (image folders: every
Nth image is kept out of training), the accuracy on the held-out images before and after training.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Subset
from torchvision import transforms

from ddp_trainer import (
    CheckpointManager,
    DistributedChunkedSampler,
    RankContext,
    S3ResultsHandler,
    ShardedDataset,
    default_reporter,
    open_dataset,
    training_state,
)
from examplekit import state_bytes

TRANSFORM = transforms.Compose([transforms.Resize((32, 32)), transforms.ToTensor()])


def shard_sample(sample: dict[str, Any]) -> tuple[torch.Tensor, int]:
    image = next(v for k, v in sample.items() if k in ("jpg", "jpeg", "png", "bmp", "webp"))
    return TRANSFORM(image.convert("RGB")), sample["cls"]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.001, help="Adam's learning rate")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0, help="initial weights and data order")
    parser.add_argument("--checkpoint-every", type=int, default=500, help="steps")
    parser.add_argument("--holdout-every", type=int, default=0,
                        help="image folders: every Nth image is held out of training and scored (0: none)")
    return parser.parse_args(argv)


def main(ctx: RankContext) -> None:
    args = parse_args(sys.argv[1:])
    probe = open_dataset()
    if isinstance(probe, ShardedDataset):
        dataset, classes = ShardedDataset(probe.index, transform=shard_sample), probe.index.extra["classes"]
    else:
        dataset, classes = open_dataset(transform=TRANSFORM), probe.classes
    held_out: Subset | None = None
    if args.holdout_every:
        if isinstance(dataset, ShardedDataset):
            raise SystemExit("--holdout-every needs an image folder, not a shard index")
        every = args.holdout_every
        held_out = Subset(dataset, range(0, len(dataset), every))
        dataset = Subset(dataset, [i for i in range(len(dataset)) if i % every])
    sampler = DistributedChunkedSampler(dataset, chunksize=256, seed=args.seed)
    # Shards: the next ones download while this one is read (set_epoch etc. stay on `sampler`).
    drawn = dataset.prefetching(sampler) if isinstance(dataset, ShardedDataset) else sampler
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=drawn, num_workers=args.workers)

    torch.manual_seed(args.seed)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(32, len(classes)),
    ).to(ctx.device)
    ddp = DistributedDataParallel(model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=args.lr)

    checkpoints = CheckpointManager(keep=3, async_save=True)
    results = S3ResultsHandler()
    progress = default_reporter(total_steps=args.epochs * len(loader))
    # After a gang restart: the job's last checkpoint (status.lastCheckpoint); 0 on a fresh start.
    step = checkpoints.resume(ddp, optimizer, sampler, map_location=ctx.device)

    if held_out is not None:
        say(ctx, f"accuracy before training: {accuracy(model, held_out, ctx):.3f}")
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(sampler.epoch, args.epochs):
        sampler.set_epoch(epoch)
        consumed = sampler.start_offset
        loss_sum, steps = 0.0, 0  # this rank's, this epoch
        for images, labels in loader:
            images, labels = images.to(ctx.device), labels.to(ctx.device)
            optimizer.zero_grad()
            loss = loss_fn(ddp(images), labels)
            loss.backward()
            optimizer.step()
            step += 1
            consumed += len(labels)
            loss_sum, steps = loss_sum + loss.item(), steps + 1
            results.log_metrics(step, epoch, loss)
            progress.report(epoch, step, loss.item(), samples=len(labels) * ctx.world_size)
            if step % args.checkpoint_every == 0:
                checkpoints.save(step, training_state(ddp, optimizer, sampler, samples_consumed=consumed))
        say(ctx, f"epoch {epoch}: loss {gang_ratio(loss_sum, steps, ctx):.4f} (mean over the gang's steps)")
    if held_out is not None:
        say(ctx, f"accuracy on {len(held_out)} held-out images after training: {accuracy(model, held_out, ctx):.3f} "
                 f"(chance {1 / len(classes):.3f})")
    if step % args.checkpoint_every != 0:
        checkpoints.save(step, training_state(ddp, optimizer, sampler, samples_consumed=sampler.num_samples))
    checkpoints.close()
    progress.flush()
    results.close()
    if ctx.rank == 0:
        results.submit_result("model.pt", state_bytes(model.state_dict()))


def say(ctx: RankContext, line: str) -> None:
    if ctx.rank == 0:
        print(line, flush=True)


def accuracy(model: nn.Module, data: Subset, ctx: RankContext) -> float:
    """The share of `data` that `model` classifies right, over the gang (each rank scores every world-th item)."""
    share = Subset(data, range(ctx.rank, len(data), ctx.world_size))
    right = 0
    with torch.no_grad():
        for images, labels in DataLoader(share, batch_size=64):
            right += int((model(images.to(ctx.device)).argmax(dim=1).cpu() == labels).sum())
    return gang_ratio(right, len(share), ctx)


def gang_ratio(numerator: float, denominator: float, ctx: RankContext) -> float:
    """sum(numerator) / sum(denominator) over the gang's ranks."""
    both = torch.tensor([numerator, denominator], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(both)
    return both[0].item() / max(both[1].item(), 1.0)
