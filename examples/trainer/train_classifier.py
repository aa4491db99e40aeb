"""Example DDPJob entrypoint: image classification from $DDP_DATASET_URI.

Run in every rank as ``python -m ddp_trainer run train_classifier:main -- --epochs 3``.
The dataset URI may be an image folder (s3://bucket/train) or a shard index
(s3://bucket/shards/index.json, see `python -m ddp_trainer make-shards`). Resumes from the
job's latest checkpoint after a gang restart, logs per-rank metrics and rank-0 progress.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
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

TRANSFORM = transforms.Compose([transforms.Resize((32, 32)), transforms.ToTensor()])


def shard_sample(sample: dict[str, Any]) -> tuple[torch.Tensor, int]:
    image = next(v for k, v in sample.items() if k in ("jpg", "jpeg", "png", "bmp", "webp"))
    return TRANSFORM(image.convert("RGB")), sample["cls"]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--checkpoint-every", type=int, default=500, help="steps")
    return parser.parse_args(argv)


def main(ctx: RankContext) -> None:
    args = parse_args(sys.argv[1:])
    probe = open_dataset()
    if isinstance(probe, ShardedDataset):
        dataset, classes = ShardedDataset(probe.index, transform=shard_sample), probe.index.extra["classes"]
    else:
        dataset, classes = open_dataset(transform=TRANSFORM), probe.classes
    sampler = DistributedChunkedSampler(dataset, chunksize=256, seed=0)
    # Shards: the next ones download while this one is read (set_epoch etc. stay on `sampler`).
    drawn = dataset.prefetching(sampler) if isinstance(dataset, ShardedDataset) else sampler
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=drawn, num_workers=args.workers)

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(256, len(classes))
    ).to(ctx.device)
    ddp = DistributedDataParallel(model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)

    checkpoints = CheckpointManager(keep=3, async_save=True)
    results = S3ResultsHandler()
    progress = default_reporter()
    # After a gang restart: the job's last checkpoint (status.lastCheckpoint); 0 on a fresh start.
    step = checkpoints.resume(ddp, optimizer, sampler, map_location=ctx.device)

    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(sampler.epoch, args.epochs):
        sampler.set_epoch(epoch)
        consumed = sampler.start_offset
        for images, labels in loader:
            images, labels = images.to(ctx.device), labels.to(ctx.device)
            optimizer.zero_grad()
            loss = loss_fn(ddp(images), labels)
            loss.backward()
            optimizer.step()
            step += 1
            consumed += len(labels)
            results.log_metrics(step, epoch, loss)
            progress.report(epoch, step, loss.item(), samples=len(labels) * ctx.world_size)
            if step % args.checkpoint_every == 0:
                checkpoints.save(step, training_state(ddp, optimizer, sampler, samples_consumed=consumed))
    if step % args.checkpoint_every != 0:
        checkpoints.save(step, training_state(ddp, optimizer, sampler, samples_consumed=sampler.num_samples))
    checkpoints.close()
    progress.flush()
    results.close()
    if ctx.rank == 0:
        results.submit_result("model.pt", _bytes(model.state_dict()))


def _bytes(state: dict[str, Any]) -> bytes:
    import io

    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()
