"""The FashionMNIST-shaped example's data step: generated 28x28 grayscale clothes in FashionMNIST's files.

    python examples/fashion/data.py s3://BUCKET/fashion [--per-class 150]

Writes the four files FashionMNIST ships (`train-images-idx3-ubyte.gz`, `train-labels-idx1-ubyte.gz`,
`t10k-images-idx3-ubyte.gz`, `t10k-labels-idx1-ubyte.gz`, IDX format, gzipped) under the DDPJob's
spec.s3.dataset. The images are crude silhouettes of FashionMNIST's ten classes (T-shirt, trouser,
pullover, dress, coat, sandal, shirt, sneaker, bag, ankle boot), each drawn at a random size,
place, tilt and brightness with noise: as hard to tell apart as the real ones in places (T-shirt,
shirt, pullover, coat), easy in others. The real dataset's files can be uploaded in their place.
S3 is chosen by DDP_S3_ENDPOINT and AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or boto3's usual
chain); the trainer runtime must be importable (`pip install '.[trainer]'`).
"""

from __future__ import annotations

import argparse
import gzip
import math
import random
import struct
import sys

from ddp_trainer import urls

SIZE = 28
Polygon = list[tuple[float, float]]


def _mirror(points: Polygon) -> Polygon:
    return [(SIZE - x, y) for x, y in points]


def _rect(x0: float, y0: float, x1: float, y1: float) -> Polygon:
    return [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]


SHORT_SLEEVE: Polygon = [(9, 6), (4, 10), (6, 13), (9, 11)]
LONG_SLEEVE: Polygon = [(9, 6), (4, 21), (7, 22), (9, 12)]
# Each class: (filled polygons, dark lines drawn over them), on a 28x28 canvas.
CLASSES: dict[str, tuple[list[Polygon], list[Polygon]]] = {
    "T-shirt/top": ([_rect(9, 6, 19, 23), SHORT_SLEEVE, _mirror(SHORT_SLEEVE)], []),
    "Trouser": ([_rect(9, 4, 13, 25), _rect(15, 4, 19, 25), _rect(9, 4, 19, 7)], []),
    "Pullover": ([_rect(9, 6, 19, 22), LONG_SLEEVE, _mirror(LONG_SLEEVE)], []),
    "Dress": ([[(11, 4), (17, 4), (22, 25), (6, 25)]], []),
    "Coat": ([_rect(9, 5, 19, 26), LONG_SLEEVE, _mirror(LONG_SLEEVE)], [[(14, 6), (14, 26)]]),
    "Sandal": ([_rect(3, 19, 25, 22)], [[(5, 19), (10, 13), (15, 19)], [(13, 19), (18, 13), (23, 19)]]),
    "Shirt": ([_rect(9, 6, 19, 23), SHORT_SLEEVE, _mirror(SHORT_SLEEVE)], [[(14, 7), (14, 23)], [(11, 6), (14, 9), (17, 6)]]),
    "Sneaker": ([[(3, 15), (15, 12), (25, 17), (25, 22), (3, 22)]], [[(3, 20), (25, 20)]]),
    "Bag": ([_rect(5, 11, 23, 25), [(9, 11), (10, 5), (18, 5), (19, 11), (16, 11), (15, 8), (13, 8), (12, 11)]], []),
    "Ankle boot": ([[(8, 3), (16, 3), (16, 15), (25, 18), (25, 24), (8, 24)]], [[(8, 21), (25, 21)]]),
}


def _placed(points: Polygon, scale: float, angle: float, dx: float, dy: float) -> Polygon:
    """The points scaled and turned about the centre, then moved."""
    c, s, mid = math.cos(angle), math.sin(angle), SIZE / 2
    return [(mid + scale * ((x - mid) * c - (y - mid) * s) + dx, mid + scale * ((x - mid) * s + (y - mid) * c) + dy)
            for x, y in points]


def draw(label: int, rng: random.Random) -> bytes:
    """SIZE*SIZE grayscale bytes of class `label`, FashionMNIST style (light garment on black)."""
    from PIL import Image, ImageDraw

    shapes, lines = list(CLASSES.values())[label]
    scale, angle = rng.uniform(0.8, 1.08), rng.uniform(-0.15, 0.15)
    dx, dy = rng.uniform(-2, 2), rng.uniform(-2, 2)
    image = Image.new("L", (SIZE, SIZE), 0)
    pen = ImageDraw.Draw(image)
    shade = rng.randrange(120, 256)
    for polygon in shapes:
        pen.polygon(_placed(polygon, scale, angle, dx, dy), fill=shade)
    for line in lines:
        pen.line(_placed(line, scale, angle, dx, dy), fill=shade // 4, width=1)
    noisy = bytes(min(255, max(0, p + int(rng.gauss(0, 18)))) if p else int(abs(rng.gauss(0, 6)))
                  for p in image.tobytes())
    return noisy


def idx_images(images: list[bytes]) -> bytes:
    """IDX3 (magic 0x00000803, count, rows, columns, then the pixels), as FashionMNIST's files."""
    return struct.pack(">IIII", 0x0803, len(images), SIZE, SIZE) + b"".join(images)


def idx_labels(labels: list[int]) -> bytes:
    return struct.pack(">II", 0x0801, len(labels)) + bytes(labels)


def write_split(root: str, prefix: str, per_class: int, seed: int) -> int:
    rng = random.Random(seed)
    labels = [label for label in range(len(CLASSES)) for _ in range(per_class)]
    rng.shuffle(labels)
    images = [draw(label, rng) for label in labels]
    urls.write_bytes(f"{root}/{prefix}-images-idx3-ubyte.gz", gzip.compress(idx_images(images)))
    urls.write_bytes(f"{root}/{prefix}-labels-idx1-ubyte.gz", gzip.compress(idx_labels(labels)))
    return len(labels)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="examples/fashion/data.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", help="the DDPJob's spec.s3.dataset: the four files go under it")
    parser.add_argument("--per-class", type=int, default=150, help="training images per class (test: a fifth)")
    args = parser.parse_args(argv)
    root = args.dataset.rstrip("/")
    train = write_split(root, "train", args.per_class, seed=0)
    test = write_split(root, "t10k", max(args.per_class // 5, 1), seed=1)
    print(f"{train} training and {test} test images (28x28, {len(CLASSES)} classes) -> {root}/")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
