"""make-shards: image folders (local or S3) into shards that ImageFolder's order and webdataset agree with."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from torchvision.datasets import ImageFolder
from trainerhelp import CONTRACT_SRC, ROOT, TRAINER_SRC, upload_tree, write_tree

from ddp_trainer.data.convert import make_shards
from ddp_trainer.data.mapdataset import ShardedDataset
from ddp_trainer.data.shardindex import load_index
from ddp_trainer.storage import s3


def test_make_shards_command_from_local_folder_to_s3(tmp_path: Path, bucket: str, s3_env) -> None:
    import webdataset as wds

    images = tmp_path / "images"
    write_tree(images)
    env = {**s3_env, "PYTHONPATH": os.pathsep.join([str(CONTRACT_SRC), str(TRAINER_SRC)]), "PATH": "/usr/bin:/bin"}
    dest = f"s3://{bucket}/shards/v1"
    result = subprocess.run(
        [sys.executable, "-m", "ddp_trainer", "make-shards", str(images), dest, "--samples-per-shard", "3"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{dest}/index.json"
    assert "make-shards [" in result.stderr and "8/8" in result.stderr  # progress bar

    folder = ImageFolder(str(images))
    index = load_index(f"{dest}/index.json")
    assert [s.nsamples for s in index.shards] == [3, 3, 2]
    assert index.extra["classes"] == folder.classes
    dataset = ShardedDataset(index, cache_dir=str(tmp_path / "cache"), decode=False)
    by_path = {Path(p).relative_to(images).as_posix(): t for p, t in folder.samples}
    got = {}
    for i in range(len(dataset)):
        sample = dataset[i]
        meta = json.loads(sample["json"])
        image_ext = next(k for k in sample if k not in ("__key__", "__url__", "json", "cls"))
        assert sample[image_ext] == (images / meta["path"]).read_bytes()
        got[meta["path"]] = int(sample["cls"])
    assert got == by_path

    # ...and the webdataset library reads our shards too.
    local = tmp_path / "ours"
    local.mkdir()
    for shard in index.shards:
        (local / Path(shard.url).name).write_bytes(s3.get_bytes(s3.parse_uri(shard.url)))
    theirs = list(wds.WebDataset(sorted(map(str, local.iterdir())), shardshuffle=False, empty_check=False))
    assert [s["__key__"] for s in theirs] == [dataset[i]["__key__"] for i in range(len(dataset))]


def test_make_shards_from_s3_source(tmp_path: Path, bucket: str) -> None:
    images = tmp_path / "images"
    write_tree(images)
    upload_tree(images, bucket, "raw")
    out = io.StringIO()
    index_url = make_shards(f"s3://{bucket}/raw", str(tmp_path / "out"), samples_per_shard=5, progress=out)
    assert index_url == str(tmp_path / "out" / "index.json")
    dataset = ShardedDataset(index_url, cache_dir=str(tmp_path / "unused-cache"))
    assert Counter(dataset[i]["cls"] for i in range(len(dataset))) == Counter(ImageFolder(str(images)).targets)
    assert "8/8" in out.getvalue()
    assert not (tmp_path / "unused-cache").exists()  # local shards are read in place
