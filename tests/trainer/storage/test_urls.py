"""The URL layer: one scheme table for s3:// and local paths."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ddp_trainer.errors import ConfigError, ObjectNotFoundError
from ddp_trainer.storage import s3, urls


def test_index_urls_resolve_against_the_index() -> None:
    assert urls.resolve("s3://b/data/idx/index.json", "shard-0.tar") == "s3://b/data/idx/shard-0.tar"
    assert urls.resolve("s3://b/data/idx/index.json", "../other/s.tar") == "s3://b/data/other/s.tar"
    assert urls.resolve("s3://b/i.json", "s3://c/x.tar") == "s3://c/x.tar"
    assert urls.resolve("/data/index.json", "sub/s.tar") == "/data/sub/s.tar"
    assert urls.resolve("file:///data/index.json", "s.tar") == "/data/s.tar"
    assert urls.resolve("s3://b/i.json", "file:///abs/x.tar") == "/abs/x.tar"


def test_schemes_and_joins() -> None:
    assert [urls.scheme_name(u) for u in ("s3://b/k", "S3://b/k", "/p", "rel/p", "file:///p", "a/b://c")] == [
        "s3", "s3", "file", "file", "file", "file"
    ]
    assert not urls.is_local("s3://b/k") and urls.is_local("/p") and urls.is_local("file:///p")
    assert urls.local_path("file:///p/q") == "/p/q" and urls.local_path("/p/q") == "/p/q"
    assert urls.join("s3://b/pre/", "x.tar") == "s3://b/pre/x.tar" == urls.join("s3://b/pre", "x.tar")
    assert urls.join("/d", "x.tar") == "/d/x.tar"
    with pytest.raises(ConfigError, match="'http://h/x.tar': unsupported URL scheme 'http'"):
        urls.read_bytes("http://h/x.tar")


def test_local_and_s3_objects_read_write_list_and_fetch_alike(tmp_path: Path, bucket: str) -> None:
    for base in (str(tmp_path / "d"), f"file://{tmp_path}/f", f"s3://{bucket}/p"):
        urls.write_bytes(urls.join(base, "a/1.bin"), b"one")
        urls.write_bytes(urls.join(base, "2.bin"), b"two")
        assert urls.read_bytes(urls.join(base, "a/1.bin")) == b"one"
        with urls.open_url(urls.join(base, "2.bin")) as f:
            assert f.read() == b"two"
        assert sorted(urls.list_names(base)) == ["2.bin", "a/1.bin"], base
        urls.fetch(urls.join(base, "a/1.bin"), str(tmp_path / "fetched"))
        assert (tmp_path / "fetched").read_bytes() == b"one"
    assert sorted(os.listdir(tmp_path / "d")) == ["2.bin", "a"]  # no temporary files left beside
    assert s3.get_bytes(s3.S3Url(bucket, "p/a/1.bin")) == b"one"


def test_missing_objects_and_folders_are_named(tmp_path: Path, bucket: str) -> None:
    with pytest.raises(ObjectNotFoundError, match=f"reading {tmp_path}/nope: file does not exist"):
        urls.read_bytes(str(tmp_path / "nope"))
    with pytest.raises(ObjectNotFoundError, match=f"reading {tmp_path}/nope: file does not exist"):
        urls.open_url(f"file://{tmp_path}/nope")
    with pytest.raises(ObjectNotFoundError, match=f"reading s3://{bucket}/nope: object does not exist"):
        urls.read_bytes(f"s3://{bucket}/nope")
    with pytest.raises(ConfigError, match="neither an s3:// URI nor a local directory"):
        urls.list_names(str(tmp_path / "nope"))


def test_atomic_path_leaves_nothing_behind_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "out"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), urls.atomic_path(str(target)) as tmp:
        Path(tmp).write_bytes(b"half")
        raise RuntimeError("interrupted")
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["out"]
    with urls.atomic_path(str(target)) as tmp:
        Path(tmp).write_bytes(b"new")
        assert target.read_bytes() == b"old"  # readers see the old file until the rename
    assert target.read_bytes() == b"new" and os.listdir(tmp_path) == ["out"]
