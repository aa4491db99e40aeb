"""Helpers for the shard tests: shards written by the webdataset library, tars of any format,
sample comparison. Plain functions; each test module wraps `upload_wds_shards` in its fixture."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

from ddp_trainer.data.shardindex import ShardIndex, load_index, write_index
from ddp_trainer.storage import s3

SHARD_SIZES = [7, 3, 11, 5, 9]  # uneven on purpose


def image(i: int) -> Image.Image:
    return Image.new("RGB", (4 + i % 3, 3), color=(i * 5 % 256, 100, 255 - i))


def write_webdataset_shards(directory: Path) -> list[dict]:
    """Shards written by the real webdataset library, plus a wids index; returns the samples."""
    import webdataset as wds

    directory.mkdir(parents=True, exist_ok=True)
    samples, shard_list, n = [], [], 0
    for shard_no, size in enumerate(SHARD_SIZES):
        name = f"part-{shard_no:03d}.tar"
        with wds.TarWriter(str(directory / name)) as sink:
            for _ in range(size):
                sample = {
                    "__key__": f"s{n:05d}",
                    "png": image(n),
                    "cls": n % 4,
                    "json": {"n": n, "tag": f"t{n}"},
                    "txt": f"caption {n}",
                    "npy": np.arange(n, n + 3, dtype=np.float32),
                }
                sink.write(sample)
                samples.append(sample)
                n += 1
        shard_list.append((name, size))
    write_index(str(directory / "index.json"), shard_list)
    return samples


def upload_wds_shards(tmp_path: Path, bucket: str) -> tuple[Path, str, list[dict]]:
    """webdataset shards under tmp_path/wds and in s3://bucket/sets/wds: (local dir, bucket, samples)."""
    local = tmp_path / "wds"
    samples = write_webdataset_shards(local)
    for path in local.iterdir():
        s3.put_bytes(s3.S3Url(bucket, f"sets/wds/{path.name}"), path.read_bytes())
    return local, bucket, samples


def webdataset_and_index(local: Path, bucket: str, written: list[dict]) -> tuple[list[dict], ShardIndex]:
    """(the local shards' samples as the webdataset library decodes them, the shards' index in S3)."""
    import webdataset as wds

    urls = [str(local / f"part-{i:03d}.tar") for i in range(len(SHARD_SIZES))]
    theirs = list(wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode("pil"))
    assert len(theirs) == sum(SHARD_SIZES) == len(written)
    return theirs, load_index(f"s3://{bucket}/sets/wds/index.json")


def assert_same_sample(ours: dict, theirs: dict) -> None:
    assert ours["__key__"] == theirs["__key__"]
    fields = {k for k in theirs if not k.startswith("__")}
    assert {k for k in ours if not k.startswith("__")} == fields
    for field in fields:
        a, b = ours[field], theirs[field]
        if isinstance(b, Image.Image):
            assert a.mode == b.mode and a.size == b.size and a.tobytes() == b.tobytes(), (ours["__key__"], field)
        elif isinstance(b, np.ndarray):
            assert a.dtype == b.dtype and np.array_equal(a, b), (ours["__key__"], field)
        else:
            assert a == b, (ours["__key__"], field)


def keys(samples: list[dict]) -> list[str]:
    """A DataLoader collate_fn: the batch's sample keys."""
    return [sample["__key__"] for sample in samples]


def tar_bytes(fmt: int, members: list[tuple[str, bytes | None]], compress: str = "") -> bytes:
    """A tar of `members` ((name, data) files, (name, None) directories) plus a symlink."""
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=f"w:{compress}", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
                continue
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("a-link.txt")
        link.type, link.linkname = tarfile.SYMTYPE, "s0.txt"
        tar.addfile(link)
    return buffer.getvalue()


def wds_shard_bytes(samples: list[dict]) -> bytes:
    """A shard written by webdataset's TarWriter (which ends it with tar's end-of-archive marker)."""
    import webdataset as wds

    buffer = io.BytesIO()
    with wds.TarWriter(buffer) as sink:
        for sample in samples:
            sink.write(sample)
    return buffer.getvalue()


def s3_shard_index(bucket: str, name: str, shard: bytes, nsamples: int) -> str:
    """`shard` at s3://bucket/<name>/shard.tar with a one-shard index beside it; the index's URL."""
    s3.put_bytes(s3.S3Url(bucket, f"{name}/shard.tar"), shard)
    index = f"s3://{bucket}/{name}/index.json"
    write_index(index, [("shard.tar", nsamples)])
    return index


def index_for(directory: Path, name: str, nsamples: int) -> ShardIndex:
    """A one-shard index beside the shard `directory/name`."""
    write_index(str(directory / "index.json"), [(name, nsamples)])
    return load_index(str(directory / "index.json"))
