"""Tar members -> samples (webdataset's grouping) and decoding by extension."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from ddp_trainer.data.samples import decode, group_members, split_name, transformed
from ddp_trainer.errors import CorruptDataError

NAMES = [
    ("a/b.seg.png", ("a/b", "seg.png")),
    ("k.cls", ("k", "cls")),
    ("a.b/c.d", ("a.b/c", "d")),
    ("a/.hidden", ("a/", "hidden")),
    ("noext", None),
    ("a.b/noext", None),
]


@pytest.mark.parametrize("name, parts", NAMES)
def test_split_name_matches_webdataset(name: str, parts: tuple[str, str] | None) -> None:
    from webdataset.tariterators import base_plus_ext

    assert split_name(name) == parts
    assert split_name(name) == (base_plus_ext(name) if parts is not None else None)


@pytest.mark.parametrize("name, parts", NAMES)
def test_grouping_splits_names_as_split_name_does(name: str, parts: tuple[str, str] | None) -> None:
    grouped = list(group_members([(name, b"")], "u"))  # the fast path where it applies, else split_name
    assert grouped == ([] if parts is None else [{"__key__": parts[0], "__url__": "u", parts[1]: b""}])


def test_members_group_by_consecutive_key_with_lower_case_extensions() -> None:
    members = [("x/k1.JPG", b"1"), ("x/k1.cls", b"2"), ("noext", b"-"), ("x/k2.cls", b"3"), ("x/k1.txt", b"4")]
    assert list(group_members(members, "u")) == [
        {"__key__": "x/k1", "__url__": "u", "jpg": b"1", "cls": b"2"},
        {"__key__": "x/k2", "__url__": "u", "cls": b"3"},
        {"__key__": "x/k1", "__url__": "u", "txt": b"4"},  # not consecutive: another sample
    ]
    assert list(group_members([], "u")) == []


def test_a_sample_with_two_members_of_one_extension_is_corrupt() -> None:
    with pytest.raises(CorruptDataError, match="shard u: sample 'k' has two 'cls' members"):
        list(group_members([("k.cls", b"1"), ("k.CLS", b"2")], "u"))


def test_grouping_stops_pulling_members_after_the_next_key() -> None:
    pulled = []

    def members():
        for name in ("a.x", "a.y", "b.x", "b.y", "c.x"):
            pulled.append(name)
            yield name, b""

    grouped = group_members(members(), "u")
    assert next(grouped)["__key__"] == "a" and pulled == ["a.x", "a.y", "b.x"]


def test_decode_by_extension() -> None:
    png = io.BytesIO()
    Image.new("RGB", (3, 2), (1, 2, 3)).save(png, format="PNG")
    npy = io.BytesIO()
    np.save(npy, np.arange(3))
    sample = {"__key__": "k", "__url__": "u", "cls": b"7", "txt": "é".encode(), "json": json.dumps({"a": 1}).encode(),
              "npy": npy.getvalue(), "seg.png": png.getvalue(), "bin": b"\x00"}
    out = decode(sample)
    assert (out["cls"], out["txt"], out["json"], out["bin"], out["__key__"]) == (7, "é", {"a": 1}, b"\x00", "k")
    assert out["npy"].tolist() == [0, 1, 2] and out["seg.png"].size == (3, 2)
    with pytest.raises(CorruptDataError, match="decoding k.cls in shard u"):
        decode({"__key__": "k", "__url__": "u", "cls": b"x"})


def test_a_shard_cut_inside_its_last_sample_names_the_shard_and_the_sample() -> None:
    members = [("s/0.jpg", b"a"), ("s/0.cls", b"0"), ("s/0.json", b"{}"), ("s/1.jpg", b"b"), ("s/1.cls", b"1")]
    grouped = group_members(iter(members), "s3://data/shard-7.tar")
    assert next(grouped)["__key__"] == "s/0"
    with pytest.raises(CorruptDataError) as cut:
        next(grouped)
    assert str(cut.value) == ("shard s3://data/shard-7.tar: its last sample 's/1' ends before its json member "
                              "(the sample before has them): the shard is cut short")


def test_a_transform_error_keeps_its_type_and_names_the_sample_and_shard() -> None:
    sample = {"__key__": "s/3", "__url__": "s3://data/shard-1.tar", "cls": 1}
    with pytest.raises(KeyError) as missing:
        transformed(lambda s: s["jpg"], sample)
    assert missing.value.__notes__ == ["in sample 's/3' of shard s3://data/shard-1.tar"]
