"""The shards example's data step: generated images converted to indexed tar shards by make-shards.

    python examples/shards/data.py s3://BUCKET/shards [--per-class 80] [--samples-per-shard 64]

Draws 32x32 coloured shapes (six classes) into image folders in a temporary directory, then runs
`python -m ddp_trainer make-shards` on each: `<dataset>/train/` and `<dataset>/val/` receive
`shard-NNNNNN.tar` files and `index.json`. S3 is chosen by DDP_S3_ENDPOINT and
AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or boto3's usual chain); the trainer runtime must be
importable (`pip install '.[trainer]'`).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # examples/datagen.py
import datagen


def make_shards(source: Path, dest: str, samples_per_shard: int) -> None:
    """`python -m ddp_trainer make-shards SOURCE DEST`, as a user types it."""
    argv = [sys.executable, "-m", "ddp_trainer", "make-shards", str(source), dest,
            "--samples-per-shard", str(samples_per_shard)]
    print("$ python -m ddp_trainer make-shards " + " ".join(argv[4:]), flush=True)
    subprocess.run(argv, check=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="examples/shards/data.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", help="the DDPJob's spec.s3.dataset: train/ and val/ shards go under it")
    parser.add_argument("--per-class", type=int, default=80, help="training images per class (val: a quarter)")
    parser.add_argument("--samples-per-shard", type=int, default=64)
    args = parser.parse_args(argv)
    root = args.dataset.rstrip("/")
    with tempfile.TemporaryDirectory(prefix="shapes-") as tmp:
        for split, per_class, seed in (("train", args.per_class, 0), ("val", max(args.per_class // 4, 1), 1)):
            count = datagen.write_image_folder(f"{tmp}/{split}", datagen.SHAPES, per_class, seed)
            print(f"{split}: {count} images of {', '.join(datagen.SHAPES)}", flush=True)
            make_shards(Path(tmp) / split, f"{root}/{split}", args.samples_per_shard)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
