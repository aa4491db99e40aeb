"""The wids shard index: relative URLs, round trip, errors that name the index."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_trainer.data.shardindex import ShardInfo, load_index, parse_index, write_index
from ddp_trainer.errors import CorruptDataError, ObjectNotFoundError
from ddp_trainer.storage import s3


def test_index_round_trip_resolves_relative_urls(tmp_path: Path, bucket: str) -> None:
    write_index(str(tmp_path / "sub" / "index.json"), [("a.tar", 3), ("/abs/b.tar", 0)], classes=["x"])
    index = load_index(str(tmp_path / "sub" / "index.json"))
    assert index.shards == [ShardInfo(str(tmp_path / "sub" / "a.tar"), 3), ShardInfo("/abs/b.tar", 0)]
    assert index.total == 3 and index.extra == {"classes": ["x"]}
    write_index(f"s3://{bucket}/v1/index.json", [("a.tar", 2), ("../v0/b.tar", 5)])
    remote = load_index(f"s3://{bucket}/v1/index.json")
    assert [s.url for s in remote.shards] == [f"s3://{bucket}/v1/a.tar", f"s3://{bucket}/v0/b.tar"]
    assert remote.total == 7


@pytest.mark.parametrize("doc, problem", [
    (b'{"wids_version": 2, "shardlist": [{"url": "a", "nsamples": 1}]}', "wids_version is 2, expected 1"),
    (b'{"wids_version": 1, "shardlist": [{"url": "a"}]}', "nsamples"),
    (b"not json", "not a valid wids index"),
    (b'{"wids_version": 1, "shardlist": []}', "lists no shards"),
    (b'{"wids_version": 1, "shardlist": [{"url": "a", "nsamples": -1}]}', "negative nsamples"),
])
def test_invalid_indexes_are_refused_naming_the_index(doc: bytes, problem: str) -> None:
    with pytest.raises(CorruptDataError, match=f"shard index /x/index.json .*{problem}"):
        parse_index(doc, "/x/index.json")


def test_missing_and_invalid_indexes_in_s3_name_their_key(bucket: str) -> None:
    with pytest.raises(ObjectNotFoundError, match=f"s3://{bucket}/sets/missing/index.json"):
        load_index(f"s3://{bucket}/sets/missing/index.json")
    s3.put_bytes(s3.S3Url(bucket, "sets/bad/index.json"), b'{"shardlist": []}')
    with pytest.raises(CorruptDataError, match=f"s3://{bucket}/sets/bad/index.json is not a valid wids index"):
        load_index(f"s3://{bucket}/sets/bad/index.json")
