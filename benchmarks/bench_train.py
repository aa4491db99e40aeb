"""Training throughput fed by the trainer's shard stream, next to synthetic data (not a test; `make bench-train`).

The GPU figure of issue 13: ResNet-50 training on one GPU, in images/s, fed two ways:
  synthetic     one batch of random tensors already on the device, reused every step: the model's own
                ceiling on this device
  shard-stream  JPEG samples in tar shards on S3 (a moto server in a child process on loopback, or the
                store DDP_S3_ENDPOINT names), read by ShardStream in --workers DataLoader workers that
                decode and augment them (RandomResizedCrop to --image-size, horizontal flip), batches in
                pinned memory copied to the device without blocking
and the ratio of the two against the target: shard-stream at least 90% of synthetic. Both run the
same step: channels-last, bf16 autocast on CUDA, SGD with momentum; the rate is over --steps steps
after --warmup, with the device synchronised at both ends.

    python benchmarks/bench_train.py            # a CUDA machine: resnet50, batch 128, 224 px, workers = cores - 1
    python benchmarks/bench_train.py --device cpu --model resnet18 --batch 8 --image-size 64 --steps 3 --warmup 1
                                                # the same code path on a CPU in seconds (tests/benchmarks runs it)
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(REPO, "benchmarks")]
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import bench_data  # noqa: E402  (puts contract and the trainer runtime on the path)
from ddp_trainer.data.convert import SourceSample, build_shard  # noqa: E402
from ddp_trainer.data.shardindex import write_index  # noqa: E402
from ddp_trainer.data.shardstream import ShardStream  # noqa: E402
from ddp_trainer.storage import s3  # noqa: E402

TARGET = 0.9  # shard-stream's share of synthetic the issue asks for
CLASSES = 1000


def jpeg_images(count: int, side: int) -> list[bytes]:
    """`count` distinct photo-like JPEGs (smooth gradients with noise, quality 90) of side x side."""
    import numpy as np
    from PIL import Image

    images = []
    ramp = np.linspace(0, 1, side, dtype=np.float32)
    for i in range(count):
        rng = np.random.default_rng(i)
        base = np.stack([np.outer(ramp, ramp) * rng.uniform(60, 255) for _ in range(3)], axis=-1)
        pixels = np.clip(base + rng.normal(0, 12, size=(side, side, 3)), 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
        images.append(buffer.getvalue())
    return images


def put_shards(bucket: str, samples: int, per_shard: int, side: int) -> tuple[str, int]:
    """Tar shards of `samples` JPEGs (512 distinct ones, reused) and their index; (index URL, bytes)."""
    images = jpeg_images(min(samples, 512), side)
    classes = [f"n{c:08d}" for c in range(CLASSES)]

    def put(number: int) -> tuple[str, int, int]:
        items = [(n, SourceSample(f"{classes[n % CLASSES]}/{n:08d}.jpg", n % CLASSES, lambda: b""), images[n % len(images)])
                 for n in range(number * per_shard, min((number + 1) * per_shard, samples))]
        name = f"shard-{number:06d}.tar"
        data = build_shard(items, classes)
        s3.put_bytes(s3.S3Url(bucket, f"train/{name}"), data)
        return name, len(items), len(data)

    with ThreadPoolExecutor(8) as pool:
        shards = list(pool.map(put, range(-(-samples // per_shard))))
    index = f"s3://{bucket}/train/index.json"
    write_index(index, [(name, count) for name, count, _ in shards])
    return index, sum(size for _, _, size in shards)


class Augment:
    """What each DataLoader worker does to a decoded sample: random crop and flip, to uint8 CHW."""

    def __init__(self, size: int) -> None:
        from torchvision.transforms import v2

        self.transform = v2.Compose([v2.PILToTensor(), v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip()])

    def __call__(self, sample: dict[str, Any]) -> tuple[torch.Tensor, int]:
        return self.transform(sample["jpg"]), int(sample["cls"])


class Trainer:
    """The model and the step both feeds share."""

    def __init__(self, args: argparse.Namespace, device: torch.device) -> None:
        import torchvision

        torch.manual_seed(0)
        self.device = device
        self.model = getattr(torchvision.models, args.model)(num_classes=CLASSES).to(device, memory_format=torch.channels_last)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.loss = nn.CrossEntropyLoss()
        self.mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
        self.std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255

    def step(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        images = images.to(self.device, non_blocking=True)
        labels = labels.to(self.device, non_blocking=True)
        if images.dtype == torch.uint8:
            images = (images.float() - self.mean) / self.std
        images = images.contiguous(memory_format=torch.channels_last)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
            loss = self.loss(self.model(images), labels)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def timed(trainer: Trainer, batches: Iterable[tuple[torch.Tensor, torch.Tensor]], warmup: int, steps: int,
          batch: int) -> dict[str, float]:
    """Images/s over `steps` steps after `warmup` (and the seconds to the first step)."""
    started = time.monotonic()
    first = steady = 0.0
    done = 0
    for done, (images, labels) in enumerate(batches, start=1):
        trainer.step(images, labels)
        if done == 1:
            trainer.sync()
            first = time.monotonic() - started
        if done == warmup:
            trainer.sync()
            steady = time.monotonic()
        if done == warmup + steps:
            break
    if done < warmup + steps:
        raise RuntimeError(f"the feed ended after {done} batches; {warmup + steps} were needed")
    trainer.sync()
    seconds = time.monotonic() - steady
    return {"images_per_s": steps * batch / seconds, "seconds": seconds, "first_step_s": first}


def synthetic(trainer: Trainer, args: argparse.Namespace) -> dict[str, float]:
    images = torch.randn(args.batch, 3, args.image_size, args.image_size, device=trainer.device)
    labels = torch.randint(0, CLASSES, (args.batch,), device=trainer.device)
    return timed(trainer, iter(lambda: (images, labels), None), args.warmup, args.steps, args.batch)


def shard_stream(trainer: Trainer, args: argparse.Namespace, index: str) -> dict[str, float]:
    stream = ShardStream(index, rank=0, world_size=1, seed=0, transform=Augment(args.image_size))
    stream.set_epoch(0)
    loader = DataLoader(stream, batch_size=args.batch, num_workers=args.workers, drop_last=True,
                        pin_memory=trainer.device.type == "cuda", prefetch_factor=4 if args.workers else None,
                        multiprocessing_context="fork" if args.workers else None)
    return timed(trainer, loader, args.warmup, args.steps, args.batch)


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if cuda else "cpu")
    parser.add_argument("--model", default="resnet50", help="a torchvision.models constructor")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--image-size", type=int, default=224, help="the crop the model sees")
    parser.add_argument("--source-size", type=int, default=0, help="side of the stored JPEGs (default: 8/7 of --image-size)")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1), help="DataLoader workers")
    parser.add_argument("--shard-samples", type=int, default=256)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    args.source_size = args.source_size or args.image_size * 8 // 7
    return args


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({os.cpu_count()} cores)"
    print(f"{args.model}, batch {args.batch}, {args.image_size} px on {name}; torch {torch.__version__}; "
          f"{args.workers} DataLoader workers; {args.warmup} warm-up + {args.steps} timed steps", flush=True)
    trainer = Trainer(args, device)
    results: dict[str, Any] = {"device": name, "model": args.model, "batch": args.batch, "image_size": args.image_size,
                               "workers": args.workers, "synthetic": synthetic(trainer, args)}
    samples = (args.warmup + args.steps + 1) * args.batch
    with bench_data.s3_endpoint():
        bucket = bench_data.make_bucket(None)
        made = time.monotonic()
        index, size = put_shards(bucket, samples, args.shard_samples, args.source_size)
        print(f"{samples} JPEGs of {args.source_size} px in shards: {size / 1e6:.0f} MB in {time.monotonic() - made:.1f} s",
              flush=True)
        results["shard-stream"] = shard_stream(trainer, args, index)
    ratio = results["shard-stream"]["images_per_s"] / results["synthetic"]["images_per_s"]
    results["ratio"] = ratio
    print(f"{'feed':<14}{'images/s':>10}{'first step':>12}")
    for feed in ("synthetic", "shard-stream"):
        row = results[feed]
        print(f"{feed:<14}{row['images_per_s']:>10.1f}{row['first_step_s']:>11.1f}s")
    print(f"shard-stream / synthetic = {ratio:.2f} (target >= {TARGET}): {'PASS' if ratio >= TARGET else 'FAIL'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
