"""Small generated image data for the examples and the demo (there is no internet to download any).

`draw(shape, rng)` is a 32x32 PNG of one coloured shape at a random place; `write_image_folder`
writes `<dest>/<class>/<nnnn>.png` (an image folder, torchvision's layout) to a local directory
or `s3://` (the trainer runtime's `urls`, so `DDP_S3_ENDPOINT` and `AWS_*` select the server).
"""

from __future__ import annotations

import io
import random
from collections.abc import Sequence

SHAPES = ("circle", "square", "cross", "triangle", "ring", "bar")
SIZE = 32


def draw(shape: str, rng: random.Random, size: int = SIZE) -> bytes:
    """A PNG of one shape at a random place and colour on a dark background: learnable in a few epochs on a CPU."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (size, size), tuple(rng.randrange(0, 60) for _ in range(3)))
    pen = ImageDraw.Draw(image)
    x, y, r = rng.randrange(8, size - 8), rng.randrange(8, size - 8), rng.randrange(5, 8)
    colour = tuple(rng.randrange(150, 256) for _ in range(3))
    if shape == "circle":
        pen.ellipse((x - r, y - r, x + r, y + r), fill=colour)
    elif shape == "square":
        pen.rectangle((x - r, y - r, x + r, y + r), fill=colour)
    elif shape == "cross":
        pen.line((x - r, y - r, x + r, y + r), fill=colour, width=3)
        pen.line((x - r, y + r, x + r, y - r), fill=colour, width=3)
    elif shape == "triangle":
        pen.polygon([(x, y - r), (x - r, y + r), (x + r, y + r)], fill=colour)
    elif shape == "ring":
        pen.ellipse((x - r, y - r, x + r, y + r), outline=colour, width=2)
    elif shape == "bar":
        pen.rectangle((x - r, y - 2, x + r, y + 2), fill=colour)
    else:
        raise ValueError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def write_image_folder(dest: str, classes: Sequence[str], per_class: int, seed: int = 0) -> int:
    """`per_class` images of each shape in `classes` under `dest` (a directory or s3:// prefix); returns the count."""
    from ddp_trainer import urls

    rng = random.Random(seed)
    for shape in classes:
        for i in range(per_class):
            urls.write_bytes(urls.join(dest, f"{shape}/{i:04d}.png"), draw(shape, rng))
    return per_class * len(classes)
