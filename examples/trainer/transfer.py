"""Transfer learning (examples/transfer): torchvision's resnet18 on an S3ImageFolder, the
dask-pytorch-ddp example as a DDPJob.

$DDP_DATASET_URI is a folder with `train/<class>/*.png` and `val/<class>/*.png`. When
`<dataset>/weights/resnet18.pth` exists (or the object `--weights` names) it holds the initial
weights: a torchvision resnet18 state dict such as ImageNet's `resnet18-f37072fd.pth`; every layer
but the classifier is loaded from it and the classifier is new, sized for this dataset's classes.
Without it the model trains from scratch. Only rank 0 reads the weights: DDP copies rank 0's
parameters to every rank when it wraps the model.

Checkpoints every `--checkpoint-every` steps, and at the next step when the job asks for one (an
elastic job whose left-out ranks run again grows at it); after a gang restart every rank resumes from the
job's last one (which then takes the place of the initial weights). At the end the ranks measure
the accuracy on `val/` together; rank 0 stores it as `results/eval.json`, the model as `results/model.pt`.

    python -m ddp_trainer run transfer:main -- --epochs 8 --checkpoint-every 20
"""

from __future__ import annotations

import argparse
import io
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler
from torchvision import models, transforms

from ddp_trainer import (
    CheckpointManager,
    DistributedChunkedSampler,
    RankContext,
    S3ImageFolder,
    training_state,
    urls,
)
from ddp_trainer.env import dataset_uri
from ddp_trainer.errors import ObjectNotFoundError
from examplekit import StepLog, arguments, distributed, evaluate_and_submit

WEIGHTS_KEY = "weights/resnet18.pth"
# ImageNet's statistics: what pretrained torchvision weights expect their input to be normalised with.
NORMALIZE = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = arguments("transfer", epochs=8, batch_size=16, lr=0.01, workers=0)
    parser.add_argument("--checkpoint-every", type=int, default=20, help="steps")
    parser.add_argument("--weights", default="", help=f"initial weights (default <dataset>/{WEIGHTS_KEY})")
    return parser.parse_args(argv)


def initial_weights(uri: str) -> dict[str, torch.Tensor] | None:
    """The state dict at `uri`, or None when nothing is there (then the model trains from scratch)."""
    try:
        data = urls.read_bytes(uri)
    except ObjectNotFoundError:
        return None
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def build_model(classes: int, weights: dict[str, torch.Tensor] | None) -> nn.Module:
    """resnet18 with a `classes`-way classifier; every other layer from `weights` when given."""
    model = models.resnet18(weights=None, num_classes=classes)
    if weights is not None:
        backbone = {k: v for k, v in weights.items() if not k.startswith("fc.")}
        missing, unexpected = model.load_state_dict(backbone, strict=False)
        if unexpected or set(missing) - {"fc.weight", "fc.bias"}:
            raise ValueError(f"the initial weights are not a resnet18 state dict: missing {missing}, unexpected {unexpected}")
    return model


def main(ctx: RankContext) -> None:
    args = parse_args(sys.argv[1:])
    root = dataset_uri().rstrip("/")
    train_tf = transforms.Compose([transforms.RandomHorizontalFlip(), transforms.ToTensor(), NORMALIZE])
    train = S3ImageFolder.from_uri(f"{root}/train", transform=train_tf)
    val = S3ImageFolder.from_uri(f"{root}/val", transform=transforms.Compose([transforms.ToTensor(), NORMALIZE]))
    # One chunk holds the whole folder: a full shuffle each epoch (there are no shards to keep together).
    sampler = DistributedChunkedSampler(train, chunksize=len(train), seed=args.seed)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers)
    val_loader = DataLoader(val, batch_size=64, sampler=DistributedSampler(val, shuffle=False), num_workers=args.workers)

    weights_uri = args.weights or f"{root}/{WEIGHTS_KEY}"
    weights = initial_weights(weights_uri) if ctx.rank == 0 else None
    if ctx.rank == 0:
        print(f"{train}, {val}; " + (f"initial weights from {weights_uri}" if weights is not None
                                     else f"no weights at {weights_uri}: training from scratch"), flush=True)
    torch.manual_seed(args.seed)
    model = build_model(len(train.classes), weights)
    ddp = distributed(model, ctx)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    checkpoints = CheckpointManager(keep=2, async_save=True)
    # After a gang restart: the job's last checkpoint (model, optimizer, sampler); step 0 on a fresh start.
    log = StepLog(ctx, step=checkpoints.resume(ddp, optimizer, sampler, map_location=ctx.device),
                  total_steps=args.epochs * len(loader))
    for epoch in range(sampler.epoch, args.epochs):
        sampler.set_epoch(epoch)
        consumed = sampler.start_offset
        for images, labels in loader:
            images, labels = images.to(ctx.device), labels.to(ctx.device)
            optimizer.zero_grad()
            loss = loss_fn(ddp(images), labels)
            loss.backward()
            optimizer.step()
            mean = log.record(epoch, loss, len(labels))
            consumed += len(labels)
            if log.step % args.checkpoint_every == 0 or checkpoints.requested():
                checkpoints.save(log.step, training_state(ddp, optimizer, sampler, samples_consumed=consumed))
        if ctx.rank == 0:
            print(f"epoch {epoch}: step {log.step}, loss {mean:.4f}", flush=True)
    checkpoints.close()

    evaluate_and_submit(ctx, log, ddp, model, val_loader, len(train.classes), train_batches=loader,
                        initial_weights=weights is not None)
