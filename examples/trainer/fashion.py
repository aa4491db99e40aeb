"""FashionMNIST-shaped data (examples/fashion), the Dpex example as a DDPJob: DataLoader workers
do the preprocessing.

$DDP_DATASET_URI is a folder holding FashionMNIST's four files (`train-images-idx3-ubyte.gz`,
`train-labels-idx1-ubyte.gz`, `t10k-images-idx3-ubyte.gz`, `t10k-labels-idx1-ubyte.gz`; IDX,
gzipped or not): the real dataset's, or the generated ones of examples/fashion/data.py. Each rank
reads them once; its `--workers` DataLoader worker processes then turn each 28x28 image into a
tensor (random affine augmentation, normalisation) while the rank trains, which is what Dpex
spreads over a Ray cluster and what a DDPJob gets by asking for CPUs per rank, or, with data workers
($DDP_DATA_WORKERS), on other machines: the runtime's DataLoader makes the same batches there. The
test set's accuracy, measured by all ranks together, is stored as `results/eval.json`.

    python -m ddp_trainer run fashion:main -- --epochs 4 --workers 2
"""

from __future__ import annotations

import argparse
import gzip
import struct
import sys
import time

import torch
from torch import nn
from torch.utils.data import Dataset, DistributedSampler
from torchvision import transforms

from ddp_trainer import DataLoader, RankContext, urls
from ddp_trainer.env import dataset_uri
from examplekit import StepLog, arguments, distributed, evaluate_and_submit

CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
# FashionMNIST's pixel mean and standard deviation (of the real training set).
NORMALIZE = transforms.Normalize((0.2860,), (0.3530,))
TRAIN_TRANSFORM = transforms.Compose([
    transforms.RandomAffine(degrees=10, translate=(0.08, 0.08), scale=(0.9, 1.1)),
    transforms.ToTensor(),
    NORMALIZE,
])
TEST_TRANSFORM = transforms.Compose([transforms.ToTensor(), NORMALIZE])


def parse_args(argv: list[str]) -> argparse.Namespace:
    return arguments("fashion", epochs=4, batch_size=50, lr=0.002, workers=2).parse_args(argv)


def read_idx(uri: str) -> torch.Tensor:
    """An IDX file (FashionMNIST's format: a magic number naming the dimensions, then unsigned bytes)."""
    data = urls.read_bytes(uri)
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    zero, kind, dims = struct.unpack(">HBB", data[:4])
    if zero != 0 or kind != 0x08:
        raise ValueError(f"{uri} is not an IDX file of unsigned bytes (header {data[:4].hex()})")
    shape = struct.unpack(f">{dims}I", data[4 : 4 + 4 * dims])
    return torch.frombuffer(bytearray(data[4 + 4 * dims :]), dtype=torch.uint8).reshape(shape)


class IdxImages(Dataset[tuple[torch.Tensor, int]]):
    """Images and labels held in memory; `transform` runs per sample, in the DataLoader's workers."""

    def __init__(self, root: str, split: str, transform: transforms.Compose) -> None:
        self.images = read_idx(f"{root}/{split}-images-idx3-ubyte.gz")
        self.labels = read_idx(f"{root}/{split}-labels-idx1-ubyte.gz")
        if len(self.images) != len(self.labels):
            raise ValueError(f"{root}: {len(self.images)} {split} images but {len(self.labels)} labels")
        self.transform = transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = transforms.functional.to_pil_image(self.images[index])
        return self.transform(image), int(self.labels[index])


def model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, len(CLASSES)),
    )


def loader(dataset: IdxImages, batch_size: int, workers: int, shuffle: bool,
           seed: int = 0) -> DataLoader[tuple[torch.Tensor, int]]:
    # Persistent workers are forked once, not every epoch; each reads its samples from the rank's copy.
    return DataLoader(dataset, batch_size=batch_size, sampler=DistributedSampler(dataset, shuffle=shuffle, seed=seed),
                      num_workers=workers, persistent_workers=workers > 0)


def main(ctx: RankContext) -> None:
    args = parse_args(sys.argv[1:])
    root = dataset_uri().rstrip("/")
    train = IdxImages(root, "train", TRAIN_TRANSFORM)
    test = IdxImages(root, "t10k", TEST_TRANSFORM)
    train_loader = loader(train, args.batch_size, args.workers, shuffle=True, seed=args.seed)
    if ctx.rank == 0:
        print(f"{len(train)} training and {len(test)} test images from {root}; "
              f"{args.workers} DataLoader workers a rank preprocess them", flush=True)

    torch.manual_seed(args.seed)
    net = model()
    ddp = distributed(net, ctx)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()
    log = StepLog(ctx, total_steps=args.epochs * len(train_loader))
    for epoch in range(args.epochs):
        train_loader.sampler.set_epoch(epoch)
        started, waited = time.monotonic(), 0.0
        ready = time.monotonic()
        for images, labels in train_loader:
            waited += time.monotonic() - ready  # time the rank waited for the workers' next batch
            images, labels = images.to(ctx.device), labels.to(ctx.device)
            optimizer.zero_grad()
            loss = loss_fn(ddp(images), labels)
            loss.backward()
            optimizer.step()
            mean = log.record(epoch, loss, len(labels))
            ready = time.monotonic()
        if ctx.rank == 0:
            print(f"epoch {epoch}: step {log.step}, loss {mean:.4f}, {time.monotonic() - started:.1f}s "
                  f"({waited:.1f}s waiting for preprocessed batches)", flush=True)

    evaluate_and_submit(ctx, log, ddp, net, loader(test, 100, args.workers, shuffle=False), len(CLASSES),
                        workers=args.workers)
