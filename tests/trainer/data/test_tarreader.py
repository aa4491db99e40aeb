"""The tar reader against tarfile: formats, compression, damage."""

from __future__ import annotations

import gzip
import io
import random
import tarfile
from pathlib import Path

import pytest
from shardhelp import index_for, s3_shard_index, tar_bytes, wds_shard_bytes

from ddp_trainer.data.mapdataset import ShardedDataset
from ddp_trainer.data.shardstream import ShardStream, iter_shard
from ddp_trainer.data.tarreader import TarEnd, TarFormatError, _header_fields, _Names, _webdataset_member, tar_entries
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


class _Reads(io.BytesIO):
    """An in-memory stream that records the sizes asked of it and returns at most `most` bytes a
    read, as a socket may."""

    def __init__(self, data: bytes, most: int | None = None) -> None:
        super().__init__(data)
        self.most, self.asked = most, list[int]()

    def read(self, size: int | None = -1) -> bytes:
        self.asked.append(-1 if size is None else size)
        short = self.most is not None and size is not None and 0 <= self.most < size
        return super().read(self.most if short else size)


def _read_like_tarfile(data: bytes) -> list[tuple[str, int, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return [(m.name, m.offset_data, tar.extractfile(m).read()) for m in tar if m.isreg()]


def test_members_straddling_reads_and_padding_come_out_as_tarfile_reads_them() -> None:
    rng = random.Random(5)
    sizes = [0, 1, 511, 512, 513, 65_000, 70_000, 200_000] + [rng.randrange(3000) for _ in range(150)]
    rng.shuffle(sizes)
    data = tar_bytes(tarfile.GNU_FORMAT, [(f"s{i:04d}.bin", rng.randbytes(size)) for i, size in enumerate(sizes)])
    expected = _read_like_tarfile(data)
    assert len(expected) == len(sizes)
    for stream in (io.BytesIO(data), _Reads(data, most=777)):  # whole reads; reads that end anywhere
        end = TarEnd()
        got = [(m.name, m.offset, m.buffer[m.start : m.start + m.size]) for m in tar_entries(stream, end=end)]
        assert got == expected
        assert end.marked


def test_the_first_member_comes_after_a_small_read_then_reads_grow() -> None:
    data = tar_bytes(tarfile.USTAR_FORMAT, [(f"s{i:04d}.bin", bytes(10_000)) for i in range(1200)])  # 12.9 MB
    stream = _Reads(data)
    members = tar_entries(stream)
    assert next(members).name == "s0000.bin"
    assert stream.asked == [64 << 10]
    assert sum(1 for _ in members) == 1199
    assert stream.asked[:8] == [64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20, 4 << 20]
    assert max(stream.asked) == 4 << 20

    big = tar_bytes(tarfile.USTAR_FORMAT, [("big.bin", bytes(10 << 20))])
    stream = _Reads(big)
    assert [m.size for m in tar_entries(stream)] == [10 << 20]
    assert stream.asked[:2] == [64 << 10, (10 << 20) - (64 << 10) + 512]  # the rest of a payload in one read


def _header(name: str, typeflag: bytes = tarfile.REGTYPE, size: int = 0) -> bytes:
    info = tarfile.TarInfo(name)
    info.type, info.size = typeflag, size
    return info.tobuf(tarfile.GNU_FORMAT)


def _checksummed(header: bytearray, signed: bool = False, off_by: int = 0) -> bytes:
    """`header` with its checksum written anew: its bytes summed, the checksum field as 8 spaces."""
    header[148:156] = b" " * 8
    checksum = sum(b - 256 if signed and b > 127 else b for b in header) + off_by
    header[148:156] = b"%06o\0 " % checksum
    return bytes(header)


def test_header_fields_read_base256_sizes_signed_checksums_and_name_bad_ones() -> None:
    big = _header("big.bin", size=8**11)  # more than 11 octal digits: GNU writes it in base-256
    assert big[124] == 0x80
    assert _header_fields(big, 0) == (b"0", 8**11)

    header = bytearray(tarfile.TarInfo("caf\xe9.bin").tobuf(tarfile.USTAR_FORMAT, encoding="latin-1"))
    signed = _checksummed(header, signed=True)  # as some old tar writers summed: bytes over 127 count negative
    assert signed != _checksummed(header)
    assert _header_fields(signed, 0) == _header_fields(_checksummed(header), 0) == (b"0", 0)

    with pytest.raises(TarFormatError, match="^bad header checksum at byte 1536$"):
        _header_fields(_checksummed(header, off_by=1), 1536)
    header[124:136] = b"12x45670000\0"
    with pytest.raises(TarFormatError, match=r"^invalid number b'12x45670000\\x00' in a header$"):
        _header_fields(_checksummed(header), 0)


def _pax(**records: str) -> bytes:
    """Pax records as a pax header's data holds them: "<length> <key>=<value>\\n", the length counting itself."""
    out = b""
    for key, value in records.items():
        body = f" {key}={value}\n".encode()
        length = len(body) + 1
        while len(str(length)) + len(body) != length:
            length = len(str(length)) + len(body)
        out += str(length).encode() + body
    return out


def test_pax_records_name_and_size_the_next_member_and_global_ones_every_member_after() -> None:
    names = _Names()
    names.other(b"g", _pax(path="global.bin"))
    names.other(b"x", _pax(path="own.bin", size="7"))
    assert names.size(100) == 7
    assert names.regular(_header("s0.bin")) == names.last == "own.bin"
    assert names.size(100) == 100
    assert names.regular(_header("s1.bin")) == "global.bin"
    names.other(b"x", _pax(path="dropped.bin"))
    names.other(tarfile.DIRTYPE, b"")  # any other member uses up the records meant for the next one
    assert names.regular(_header("s2.bin")) == "global.bin"
    with pytest.raises(TarFormatError, match="^invalid pax header$"):
        names.other(b"x", b"twelve path=a\n")


def test_a_gnu_long_name_names_the_next_regular_member_only() -> None:
    names = _Names()
    names.other(b"L", b"long/" * 30 + b"name.bin\0")
    names.other(b"K", b"a long link target\0")  # a long link name leaves it for the member
    assert names.regular(_header("cut-short.bin")) == "long/" * 30 + "name.bin"
    assert names.regular(_header("s1.bin")) == names.last == "s1.bin"
    names.other(b"L", b"the-link.bin\0")
    names.other(tarfile.SYMTYPE, b"")  # a symlink's own long name: not for the member after it
    assert names.regular(_header("s2.bin")) == "s2.bin"
    with pytest.raises(TarFormatError, match="^GNU sparse members are not supported$"):
        names.other(tarfile.GNUTYPE_SPARSE, b"")


def test_long_link_names_read_as_tarfile_reads_them() -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        link = tarfile.TarInfo("l" * 150)
        link.type, link.linkname = tarfile.SYMTYPE, "t" * 150  # a K and an L header before it
        tar.addfile(link)
        tar.addfile(tarfile.TarInfo("s0.bin"), io.BytesIO())
    data = buffer.getvalue()
    assert data.count(b"././@LongLink") == 2
    assert [(m.name, m.offset) for m in tar_entries(io.BytesIO(data))] == [(n, o) for n, o, _ in _read_like_tarfile(data)]


@pytest.mark.parametrize(
    ("name", "typeflag", "kept"),
    [
        ("s0.bin", b"0", True),
        ("s0.bin", b"\0", True),
        ("old-style-dir/", b"\0", False),  # tar before POSIX: a directory is a regular file named with a slash
        ("name-with-slash/", b"0", True),  # tarfile too reads only the old type so
        ("__meta__", b"0", False),  # webdataset's top-level metadata
        ("a/__meta__", b"0", True),
        ("__meta", b"0", True),
    ],
)
def test_webdataset_members(name: str, typeflag: bytes, kept: bool) -> None:
    assert _webdataset_member(name, typeflag) is kept


def test_an_old_style_directory_is_left_out_as_tarfile_leaves_it() -> None:
    old_dir = bytearray(_header("old-style-dir/"))
    old_dir[156:157] = b"\0"
    data = _checksummed(old_dir) + tar_bytes(tarfile.USTAR_FORMAT, [("s0.bin", b"x")])
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert tar.getmember("old-style-dir").isdir()
    assert [m.name for m in tar_entries(io.BytesIO(data))] == ["s0.bin"] == [n for n, _, _ in _read_like_tarfile(data)]


def test_damaged_compressed_data_is_a_format_error_naming_the_compression() -> None:
    packed = bytearray(gzip.compress(bytes(range(256)) * 64, mtime=0))
    packed[20:40] = b"\xff" * 20  # inside the deflate stream, past gzip's 10-byte header
    with pytest.raises(TarFormatError, match=r"^gzip data: "):
        list(tar_entries(io.BytesIO(bytes(packed)), allow_compressed=True))
