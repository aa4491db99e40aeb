"""The tar reader against tarfile: formats, compression, damage."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
from shardhelp import index_for, s3_shard_index, tar_bytes, wds_shard_bytes

from ddp_trainer.data.mapdataset import ShardedDataset
from ddp_trainer.data.shardstream import ShardStream, iter_shard
from ddp_trainer.errors import CorruptDataError


@pytest.mark.parametrize("fmt_name", ["USTAR_FORMAT", "GNU_FORMAT", "PAX_FORMAT"])
@pytest.mark.parametrize("compress", ["", "gz", "bz2", "xz"])
def test_tar_reader_matches_tarfile(tmp_path: Path, fmt_name: str, compress: str) -> None:
    long_dir = "d" * 120 if fmt_name != "USTAR_FORMAT" else "p" * 90  # ustar splits into prefix/name
    members: list[tuple[str, bytes | None]] = [("__meta__", b"{}"), ("dir/", None)]
    for i in range(6):
        stem = f"{long_dir}/k{i}" if i % 2 else f"s{i}"
        if fmt_name == "PAX_FORMAT" and i == 3:
            stem = f"dir/ünï{i}"
        members += [(f"{stem}.txt", f"t{i}".encode()), (f"{stem}.SEG.png", bytes(range(i * 97 % 256)) * 9), (f"{stem}.cls", b"")]
    path = tmp_path / f"s.tar{'.' + compress if compress else ''}"
    path.write_bytes(tar_bytes(getattr(tarfile, fmt_name), members, compress))

    with tarfile.open(path, "r:*") as tar:
        expected = [(m.name, tar.extractfile(m).read()) for m in tar if m.isreg() and m.name != "__meta__"]
    got = [(s["__key__"] + "." + ext, s[ext]) for s in iter_shard(str(path), 6) for ext in s if not ext.startswith("__")]
    assert [(n.rsplit(".", 2)[0] if n.endswith(".png") else n.rsplit(".", 1)[0]) for n, _ in got] == [
        (n.rsplit(".", 2)[0] if n.endswith(".png") else n.rsplit(".", 1)[0]) for n, _ in expected
    ]
    assert sorted(d for _, d in got) == sorted(d for _, d in expected)
    samples = list(iter_shard(str(path), 6))
    assert samples[3]["seg.png"] == bytes(range(3 * 97 % 256)) * 9 and samples[4]["cls"] == b""
    assert [s["__key__"] for s in iter_shard(str(path), 6, skip=2, stop=4)] == [s["__key__"] for s in samples[2:4]]
    if not compress:
        mapped = ShardedDataset(
            index_for(tmp_path, path.name, 6), cache_dir=str(tmp_path / "cache"), decode=False
        )
        assert [mapped[i] for i in range(6)] == samples


def test_tar_reader_rejects_damage(tmp_path: Path) -> None:
    good = tar_bytes(tarfile.USTAR_FORMAT, [(f"s{i}.bin", bytes(1000)) for i in range(4)])
    cases = {
        # members take 3 blocks each: a header and 1000 bytes of data
        "flipped": (good[: 512 * 3 + 5] + b"X" + good[512 * 3 + 6 :], "bad header checksum at byte 1536"),
        "cut-in-data": (good[: 512 * 4 + 100], "unexpected end of data at byte 2148 in sample 's1' (member 's1.bin')"),
        "cut-in-header": (good[: 512 * 3 + 100], "truncated header at byte 1536 after sample 's0' (member 's0.bin')"),
    }
    for label, (data, error) in cases.items():
        path = tmp_path / f"{label}.tar"
        path.write_bytes(data)
        with pytest.raises(CorruptDataError) as damaged:
            list(iter_shard(str(path), 4))
        assert str(damaged.value) == f"shard {path} is not a readable tar: {error}"
    (tmp_path / "whole.tar").write_bytes(good[: 512 * 3])  # ends at a member boundary: fewer samples
    with pytest.raises(CorruptDataError, match="holds 1 samples but the index says 4"):
        list(iter_shard(str(tmp_path / "whole.tar"), 4))
    gz = tmp_path / "gz.tar"
    gz.write_bytes(tar_bytes(tarfile.USTAR_FORMAT, [("s0.bin", b"x")], "gz"))
    dataset = ShardedDataset(index_for(tmp_path, "gz.tar", 1), cache_dir=str(tmp_path / "c"), decode=False)
    with pytest.raises(CorruptDataError, match="gz.tar is not a readable uncompressed tar: gzip-compressed"):
        dataset[0]


def test_a_shard_cut_inside_a_member_names_the_sample_both_ways(bucket: str, tmp_path: Path) -> None:
    shard = wds_shard_bytes([{"__key__": f"s{i:05d}", "bin": bytes([i]) * 1500, "cls": i} for i in range(4)])
    with tarfile.open(fileobj=io.BytesIO(shard)) as tar:
        cut_at = tar.getmember("s00002.bin").offset_data + 700
    index = s3_shard_index(bucket, "cut", shard[:cut_at], 4)
    error = f"unexpected end of data at byte {cut_at} in sample 's00002' (member 's00002.bin')"
    with pytest.raises(CorruptDataError) as streamed:
        list(ShardStream(index, rank=0, world_size=1, shuffle=False, decode=False))
    assert str(streamed.value) == f"shard s3://{bucket}/cut/shard.tar is not a readable tar: {error}"
    with pytest.raises(CorruptDataError) as mapped:
        ShardedDataset(index, cache_dir=str(tmp_path / "cache"), decode=False)[0]
    assert str(mapped.value) == f"shard s3://{bucket}/cut/shard.tar is not a readable uncompressed tar: {error}"


def test_a_whole_shard_whose_last_sample_lacks_an_optional_member_is_read_both_ways(bucket: str, tmp_path: Path) -> None:
    """Only the end-of-archive marker tells a last sample without its caption from one cut short."""
    samples = [{"__key__": f"s{i:05d}", "bin": bytes([i]) * 700, "cls": i} for i in range(4)]
    for sample in samples[::2]:
        sample["txt"] = f"caption {sample['cls']}"  # on some samples only: not on the last
    shard = wds_shard_bytes(samples)
    whole = s3_shard_index(bucket, "whole", shard, 4)
    streamed = list(ShardStream(whole, rank=0, world_size=1, shuffle=False))
    mapped = ShardedDataset(whole, cache_dir=str(tmp_path / "cache"))
    for read in (streamed, [mapped[i] for i in range(4)]):
        assert [{k: v for k, v in s.items() if k != "__url__"} for s in read] == samples

    with tarfile.open(fileobj=io.BytesIO(shard)) as tar:
        last = tar.getmember("s00003.cls")
    cut = s3_shard_index(bucket, "cut", shard[: last.offset_data + 512], 4)  # the marker and padding cut off
    error = (f"shard s3://{bucket}/cut/shard.tar: its last sample 's00003' ends before its txt member "
             "(the sample before has them): the shard is cut short")
    with pytest.raises(CorruptDataError) as cut_streamed:
        list(ShardStream(cut, rank=0, world_size=1, shuffle=False))
    with pytest.raises(CorruptDataError) as cut_mapped:
        ShardedDataset(cut, cache_dir=str(tmp_path / "cache"))[0]
    assert str(cut_streamed.value) == str(cut_mapped.value) == error
