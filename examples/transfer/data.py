"""The transfer-learning example's data step: small generated images as an image folder in S3.

    python examples/transfer/data.py s3://BUCKET/transfer [--per-class 48] [--weights resnet18-f37072fd.pth]

Writes `train/<shape>/NNNN.png` and `val/<shape>/NNNN.png` (32x32 coloured shapes, four classes)
under the DDPJob's spec.s3.dataset, and with --weights uploads a torchvision resnet18 state dict
(e.g. ImageNet's, from download.pytorch.org) to `<dataset>/weights/resnet18.pth`, where the trainer
looks for initial weights. S3 is chosen by DDP_S3_ENDPOINT and AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY
(or boto3's usual chain); the trainer runtime must be importable (`pip install '.[trainer]'`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ddp_trainer import urls

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # examples/datagen.py
import datagen

CLASSES = ("circle", "square", "triangle", "cross")
WEIGHTS_KEY = "weights/resnet18.pth"  # transfer.py's WEIGHTS_KEY


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="examples/transfer/data.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", help="the DDPJob's spec.s3.dataset: train/ and val/ go under it")
    parser.add_argument("--per-class", type=int, default=48, help="training images per class (val: a quarter)")
    parser.add_argument("--weights", type=Path, help="a resnet18 state dict to start from")
    args = parser.parse_args(argv)
    root = args.dataset.rstrip("/")
    train = datagen.write_image_folder(f"{root}/train", CLASSES, args.per_class, seed=0)
    val = datagen.write_image_folder(f"{root}/val", CLASSES, max(args.per_class // 4, 1), seed=1)
    print(f"{train} training and {val} validation images of {', '.join(CLASSES)} -> {root}/train, {root}/val")
    if args.weights:
        urls.write_bytes(f"{root}/{WEIGHTS_KEY}", args.weights.read_bytes())
        print(f"initial weights {args.weights} -> {root}/{WEIGHTS_KEY}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
