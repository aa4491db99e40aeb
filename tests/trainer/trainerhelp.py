"""Helpers the trainer's data tests share: paths, the rank launcher, image trees on disk and in S3.

Plain functions imported by name; conftest.py keeps the fixtures, and the launcher defined there
is re-exported here so that test modules need not import from conftest.
"""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from conftest import ROOT, TRAINER_SRC, free_port, launch
from ddp_trainer import s3

__all__ = ["ROOT", "TRAINER_SRC", "FILES", "free_port", "launch", "write_tree", "upload_tree"]

FILES = [
    "cat/1.png",
    "cat/b/2.JPG",
    "cat/a.png",
    "cat/a/0.png",
    "cat/notes.txt",  # not an image: skipped by both
    "dog/x.jpeg",
    "dog/y.png",
    "emu/deep/er/z.bmp",
    "emu/deep-2.png",
]


def write_tree(root: Path) -> None:
    for i, rel in enumerate(FILES):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if rel.endswith(".txt"):
            path.write_text("hello")
            continue
        fmt = {".png": "PNG", ".jpg": "JPEG", ".jpeg": "JPEG", ".bmp": "BMP"}[path.suffix.lower()]
        Image.new("RGB", (6 + i, 5), color=(20 * i, 255 - 20 * i, 7 * i)).save(path, format=fmt)


def upload_tree(root: Path, bucket: str, prefix: str) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            s3.put_bytes(s3.S3Url(bucket, f"{prefix}/{path.relative_to(root).as_posix()}"), path.read_bytes())
