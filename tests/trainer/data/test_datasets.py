"""open_dataset: the job's dataset URI to the reader it names (shards map-style or streamed, an image folder)."""

from __future__ import annotations

from pathlib import Path

import pytest
from shardhelp import tar_bytes
from trainerhelp import upload_tree, write_tree

from ddp_trainer import open_dataset
from ddp_trainer.data.imagefolder import S3ImageFolder
from ddp_trainer.data.mapdataset import ShardedDataset
from ddp_trainer.data.shardindex import write_index
from ddp_trainer.data.shardstream import ShardStream
from ddp_trainer.errors import ConfigError


def _local_shards(directory: Path) -> str:
    (directory / "shard.tar").write_bytes(tar_bytes(0, [("s0.cls", b"1"), ("s1.cls", b"2")]))
    write_index(str(directory / "index.json"), [("shard.tar", 2)])
    return str(directory / "index.json")


def test_a_shard_index_opens_map_style_or_streamed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    index = _local_shards(tmp_path)
    assert type(open_dataset(index, cache_dir=str(tmp_path / "cache"))) is ShardedDataset
    monkeypatch.setenv("DDP_DATASET_URI", index)  # the default URI
    stream = open_dataset(streaming=True)
    assert type(stream) is ShardStream and len(stream) == 2


def test_an_s3_prefix_opens_as_an_image_folder(bucket: str, tmp_path: Path) -> None:
    write_tree(tmp_path)
    upload_tree(tmp_path, bucket, "images")
    folder = open_dataset(f"s3://{bucket}/images")
    assert type(folder) is S3ImageFolder and folder.classes == ["cat", "dog", "emu"]


def test_streaming_an_image_folder_or_no_uri_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="DDP_DATASET_URI='s3://b/images': streaming needs a shard index"):
        open_dataset("s3://b/images", streaming=True)
    monkeypatch.delenv("DDP_DATASET_URI", raising=False)
    with pytest.raises(ConfigError, match="DDP_DATASET_URI is not set"):
        open_dataset()
