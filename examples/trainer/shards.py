"""A small ResNet on indexed tar shards (examples/shards), the wids example as a DDPJob.

$DDP_DATASET_URI is a folder with `train/index.json` and `val/index.json`, each a wids index
over webdataset tar shards as `python -m ddp_trainer make-shards` writes them (`<key>.png`,
`<key>.cls`). Training reads the map-style `ShardedDataset` with `DistributedChunkedSampler`
(chunks of about a shard, so each rank reads few shards at a time, the next ones downloading
while one is read); `--stream` reads the same shards with `ShardStream` instead (sequential,
every rank the same number of batches). The held-out accuracy is measured by streaming the
validation shards on every rank; rank 0 stores it as `results/eval.json`.

    python -m ddp_trainer run shards:main -- --epochs 6
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader
from torchvision import transforms
from torchvision.models.resnet import BasicBlock

from ddp_trainer import (
    DistributedChunkedSampler,
    RankContext,
    ShardedDataset,
    ShardStream,
    load_index,
)
from ddp_trainer.env import dataset_uri
from examplekit import StepLog, arguments, distributed, evaluate_and_submit

TO_TENSOR = transforms.Compose([transforms.ToTensor(), transforms.Normalize([0.5] * 3, [0.5] * 3)])
AUGMENT = transforms.Compose([transforms.RandomHorizontalFlip(), TO_TENSOR])


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = arguments("shards", epochs=6, batch_size=32, lr=0.05, workers=0)
    parser.add_argument("--stream", action="store_true", help="train on ShardStream instead of the map-style dataset")
    return parser.parse_args(argv)


def image_and_class(augment: bool) -> Any:
    """A shard sample ({"png": image, "cls": index, ...}) as (tensor, class)."""
    transform = AUGMENT if augment else TO_TENSOR

    def convert(sample: dict[str, Any]) -> tuple[torch.Tensor, int]:
        return transform(sample["png"].convert("RGB")), int(sample["cls"])

    return convert


class SmallResNet(nn.Module):
    """A ResNet for 32x32 images: a 3x3 stem and one torchvision BasicBlock per width (ResNet-8)."""

    def __init__(self, classes: int, widths: tuple[int, ...] = (16, 32, 64)) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, padding=1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU())
        blocks, channels = [], widths[0]
        for i, width in enumerate(widths):
            stride = 1 if i == 0 else 2
            downsample = None
            if stride != 1 or channels != width:
                downsample = nn.Sequential(nn.Conv2d(channels, width, 1, stride, bias=False), nn.BatchNorm2d(width))
            blocks.append(BasicBlock(channels, width, stride, downsample))
            channels = width
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)))


def training_data(index_uri: str, args: argparse.Namespace) -> tuple[DataLoader[Any], Any]:
    """(loader, what to call set_epoch on): map-style with the chunked sampler, or the stream."""
    index = load_index(index_uri)
    if args.stream:
        stream = ShardStream(index, shuffle_buffer=64, seed=args.seed, transform=image_and_class(augment=True))
        return DataLoader(stream, batch_size=args.batch_size, num_workers=args.workers), stream
    dataset = ShardedDataset(index, transform=image_and_class(augment=True))
    sampler = DistributedChunkedSampler(dataset, chunksize=max(s.nsamples for s in index.shards), seed=args.seed)
    # The next shards download while one is read; set_epoch stays on `sampler`.
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=dataset.prefetching(sampler), num_workers=args.workers)
    return loader, sampler


def main(ctx: RankContext) -> None:
    args = parse_args(sys.argv[1:])
    root = dataset_uri().rstrip("/")
    loader, epochs = training_data(f"{root}/train/index.json", args)
    val = ShardStream(f"{root}/val/index.json", shuffle=False, transform=image_and_class(augment=False))
    classes = load_index(f"{root}/val/index.json").extra["classes"]
    if ctx.rank == 0:
        print(f"{'ShardStream' if args.stream else 'ShardedDataset + DistributedChunkedSampler'}: "
              f"{len(loader)} batches an epoch per rank, classes {classes}", flush=True)

    torch.manual_seed(args.seed)
    model = SmallResNet(len(classes))
    ddp = distributed(model, ctx)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    loss_fn = nn.CrossEntropyLoss()
    log = StepLog(ctx, total_steps=args.epochs * len(loader))
    for epoch in range(args.epochs):
        epochs.set_epoch(epoch)
        for images, labels in loader:
            images, labels = images.to(ctx.device), labels.to(ctx.device)
            optimizer.zero_grad()
            loss = loss_fn(ddp(images), labels)
            loss.backward()
            optimizer.step()
            mean = log.record(epoch, loss, len(labels))
        if ctx.rank == 0:
            print(f"epoch {epoch}: step {log.step}, loss {mean:.4f}", flush=True)

    evaluate_and_submit(ctx, log, ddp, model, DataLoader(val, batch_size=64), len(classes), train_batches=loader,
                        dataset="stream" if args.stream else "map")
