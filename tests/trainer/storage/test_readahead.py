"""Ranged, parallel reads of one S3 object (ReadAhead) against the test S3 server on loopback."""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from ddp_contract import envnames
from ddp_trainer import env
from ddp_trainer.errors import ObjectNotFoundError
from ddp_trainer.storage import s3
from ddp_trainer.storage.readahead import ReadAhead, object_size, open_readahead, part_ranges
from linkproxy import LinkProxy
from waiting import wait_until

PART = 4096


def test_part_ranges_and_object_size() -> None:
    assert part_ranges(4, 10, 4) == [(4, 8), (8, 10)]
    assert part_ranges(8, 16, 4) == [(8, 12), (12, 16)]
    assert part_ranges(8, 8, 4) == [] and part_ranges(0, 0, 4) == []
    assert object_size({"ContentRange": "bytes 0-3/10", "ContentLength": 4}) == 10
    assert object_size({"ContentLength": 7}) is None  # a store that ignored the Range


def _read_in_pieces(reader, rng: random.Random) -> bytes:
    pieces = []
    while True:
        piece = reader.read(rng.choice([1, 7, 512, PART - 1, PART, PART + 1, 3 * PART + 5, 1 << 20]))
        if not piece:
            return b"".join(pieces)
        pieces.append(piece)


@pytest.mark.parametrize("size", [0, 1, PART - 1, PART, PART + 1, 2 * PART, 7 * PART + 123])
@pytest.mark.parametrize("ahead", [1, 3])
def test_ranged_reads_return_the_object_in_order(bucket: str, size: int, ahead: int) -> None:
    data = os.urandom(size)
    url = s3.S3Url(bucket, f"obj-{size}")
    s3.put_bytes(url, data)
    with ReadAhead(url, PART, ahead) as reader:
        assert reader.size == size
        assert _read_in_pieces(reader, random.Random(size)) == data
        assert reader.read(100) == b""
        assert reader.parts_fetched == len(part_ranges(PART, size, PART))
    with ReadAhead(url, PART, ahead) as reader:
        assert reader.read(1) == data[:1]
        assert reader.read() == data[1:]


def test_settings_choose_read_ahead_or_a_plain_stream(bucket: str, s3_env) -> None:
    data = os.urandom(5 * PART)
    url = s3.S3Url(bucket, "obj")
    s3.put_bytes(url, data)
    settings = env.S3Settings.from_env({**s3_env, envnames.S3_READ_PART_BYTES: str(PART), envnames.S3_READ_AHEAD: "2"})
    assert (settings.read_part_bytes, settings.read_ahead) == (PART, 2)
    reader = open_readahead(url, settings=settings)
    assert reader.read(PART) + reader.read() == data and reader.parts_fetched == 4
    reader.close()
    with open_readahead(url, settings=env.S3Settings.from_env({**s3_env, envnames.S3_READ_AHEAD: "0"})) as single:
        assert single.read(PART) + single.read() == data and single.parts_fetched == 0  # one GET


def test_missing_object_names_its_key(bucket: str) -> None:
    with pytest.raises(ObjectNotFoundError, match=f"s3://{bucket}/no/such.tar"):
        ReadAhead(s3.S3Url(bucket, "no/such.tar"), PART, 2)


def test_closing_early_stops_the_fetch_threads(bucket: str) -> None:
    url = s3.S3Url(bucket, "big")
    s3.put_bytes(url, os.urandom(40 * PART))
    reader = ReadAhead(url, PART, 3)
    assert len(reader.read(10)) == 10 and reader.parts_fetched == 3
    reader.close()
    wait_until(lambda: not [t for t in threading.enumerate() if t.name.startswith("s3-read-ahead")], 10,
               "the read-ahead threads to stop", interval=0.05)


@pytest.fixture
def link_proxy(s3_endpoint: str) -> Iterator[Callable[..., LinkProxy]]:
    proxies: list[LinkProxy] = []

    def make(**options: float) -> LinkProxy:
        proxies.append(LinkProxy(s3_endpoint, **options))  # type: ignore[arg-type]
        return proxies[-1]

    yield make
    for proxy in proxies:
        proxy.close()


def _client_via(proxy: LinkProxy, s3_env) -> object:
    return s3.make_client(env.S3Settings.from_env({**s3_env, envnames.S3_ENDPOINT: proxy.url}))


def test_bodies_cut_mid_stream_are_resumed(bucket: str, s3_env, link_proxy) -> None:
    data = os.urandom(4 * 8 * PART + 99)
    url = s3.S3Url(bucket, "flaky")
    s3.put_bytes(url, data)
    proxy = link_proxy(cuts=3, cut_after=3 * PART)
    with ReadAhead(url, 8 * PART, 2, _client_via(proxy, s3_env)) as reader:
        assert _read_in_pieces(reader, random.Random(1)) == data
    assert proxy.cut_done == 3  # the first connection and two ranged parts were cut, and recovered

    proxy = link_proxy(cuts=2, cut_after=3 * PART)
    one_get = env.S3Settings.from_env({**s3_env, envnames.S3_READ_AHEAD: "0"})
    with open_readahead(url, _client_via(proxy, s3_env), one_get) as reader:
        assert _read_in_pieces(reader, random.Random(2)) == data and reader.parts_fetched == 0
    assert proxy.cut_done == 2  # one GET per shard is resumed the same way


def test_a_slow_link_is_read_over_parallel_connections(bucket: str, s3_env, link_proxy) -> None:
    data = os.urandom(64 * PART)  # 256 KB: the first 32 KB part streamed, 7 more fetched 3 at a time
    url = s3.S3Url(bucket, "far")
    s3.put_bytes(url, data)
    # 2 s for the object over one connection, against about 1 s over three: slow enough that what each
    # request costs the CPU (a busy machine's tenths of a second) cannot close the gap.
    proxy = link_proxy(rate=128 * 1024)
    client = _client_via(proxy, s3_env)

    def timed(reader) -> float:
        started = time.monotonic()
        with reader:
            assert b"".join(iter(lambda: reader.read(PART), b"")) == data
        return time.monotonic() - started

    one_connection = timed(s3.open_stream(url, client))
    ranged = timed(ReadAhead(url, 8 * PART, 3, client))
    assert proxy.ranged_requests == 1 + 7 and proxy.most_connections_at_once >= 3
    assert ranged < one_connection / 1.5, (ranged, one_connection)
