"""The pet-names example's data step: upload names.txt (one name a line) to where the DDPJob reads it.

    python examples/petnames/data.py s3://BUCKET/petnames/names.txt

S3 is chosen by DDP_S3_ENDPOINT and AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or boto3's usual
chain); the trainer runtime must be importable (`pip install '.[trainer]'` in this repository).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ddp_trainer import urls

NAMES = Path(__file__).resolve().parent / "names.txt"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="examples/petnames/data.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", help="the DDPJob's spec.s3.dataset: where the names go")
    parser.add_argument("--names", type=Path, default=NAMES, help="a names file of your own")
    args = parser.parse_args(argv)
    data = args.names.read_bytes()
    urls.write_bytes(args.dataset, data)
    print(f"{sum(1 for line in data.decode().splitlines() if line and not line.startswith('#'))} names -> {args.dataset}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
