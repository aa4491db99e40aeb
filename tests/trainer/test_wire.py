"""The data channel's messages (wire.py) over real pipes and a real TCP connection: tensors outside the
pickle, every frame read straight into its buffer in the framing multiprocessing.connection writes."""

from __future__ import annotations

import multiprocessing
import os
import struct
import threading

import pytest
import torch

from ddp_trainer import wire

TOKEN = b"a job's token"


def test_tensors_travel_outside_the_pickle_and_come_back_equal() -> None:
    batch = {"x": torch.randn(3, 5), "b": torch.tensor([True, False]), "h": torch.ones(2, dtype=torch.bfloat16),
             "empty": torch.empty(0, 4), "scalar": torch.tensor(3), "strided": torch.arange(12).reshape(3, 4).t(),
             "names": ["a", "b"]}
    frames = wire.encode(batch)
    assert len(frames) == 2 + 6  # sizes, the structure, one frame per tensor
    assert len(frames[1]) < 1000  # the structure holds no tensor's data
    reader, writer = multiprocessing.Pipe(duplex=False)
    wire.send(writer, batch)
    got = wire.receive(reader)
    for key, value in batch.items():
        if isinstance(value, torch.Tensor):
            assert got[key].dtype == value.dtype and torch.equal(got[key], value), key
    assert got["names"] == ["a", "b"]


def test_messages_of_every_size_follow_each_other_over_tcp_with_the_connections_own_reads_between() -> None:
    """Frames under and over Connection's 16 KiB (header and data written apart), a 20 MB tensor, and
    a plain recv_bytes between messages: the reads into buffers leave the stream where it belongs."""
    listener = wire.listen("127.0.0.1", 0, TOKEN)
    messages = [("small", torch.arange(10)), ("over 16 KiB", torch.randn(5000)), ("20 MB", torch.randn(5_000_000)),
                ("none", torch.empty(0))]
    sent = threading.Event()

    def peer() -> None:
        conn = wire.accept(listener)
        for message in messages:
            wire.send(conn, message)
            conn.send_bytes(b"between")
        sent.set()
        conn.close()

    thread = threading.Thread(target=peer)
    thread.start()
    conn = wire.connect("127.0.0.1", listener.address[1], TOKEN)
    try:
        for name, tensor in messages:
            got_name, got = wire.receive(conn)
            assert got_name == name and torch.equal(got, tensor), name
            assert conn.recv_bytes() == b"between"
        with pytest.raises(EOFError):
            wire.receive(conn)
    finally:
        thread.join(10)
        conn.close()
        listener.close()
    assert sent.is_set()


def test_a_frame_past_2_gib_s_long_length_prefix_is_read_as_connection_writes_it() -> None:
    """Past 0x7fffffff bytes Connection writes -1, then the length as 8 bytes: the same prefix written
    by hand in front of a small frame is read the same way."""
    reader, writer = multiprocessing.Pipe(duplex=False)
    os.write(writer.fileno(), struct.pack("!i", -1) + struct.pack("!Q", 3) + b"abc")
    frame = wire._receive_into(reader, bytearray(3))  # the long branch, without sending 2 GiB
    assert frame == b"abc"


def test_a_peer_that_stops_mid_frame_or_sends_another_size_is_an_error_not_a_short_batch() -> None:
    reader, writer = multiprocessing.Pipe(duplex=False)
    writer.send_bytes(wire.SIZES.pack(10))
    os.write(writer.fileno(), struct.pack("!i", 10) + b"12345")
    writer.close()
    with pytest.raises(EOFError, match="mid-message"):
        wire.receive(reader)
    reader, writer = multiprocessing.Pipe(duplex=False)
    writer.send_bytes(wire.SIZES.pack(10))
    writer.send_bytes(b"123")
    with pytest.raises(ValueError, match="a frame of 3 bytes came where 10 were announced"):
        wire.receive(reader)


def test_a_data_worker_whose_rank_reads_slowly_keeps_its_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """A data worker's batches wait in a full socket (a zero window) for as long as the rank takes to
    read them: that is no sign of a lost rank, so its side must not give up on it as the rank's side
    gives up on a data worker that stopped answering (Linux ends a connection whose zero-window probes
    outlast TCP_USER_TIMEOUT)."""
    monkeypatch.setattr(wire, "DEAD_PEER_SECONDS", 1)
    listener = wire.listen("127.0.0.1", 0, TOKEN)
    batches = [torch.full((5_000_000,), float(i)) for i in range(3)]  # 60 MB: more than the sockets hold
    failed: list[BaseException] = []

    def data_worker() -> None:
        conn = wire.accept(listener)
        try:
            for batch in batches:
                wire.send(conn, batch)
        except BaseException as error:  # noqa: BLE001 - said by the test
            failed.append(error)
        finally:
            conn.close()

    thread = threading.Thread(target=data_worker)
    thread.start()
    conn = wire.connect("127.0.0.1", listener.address[1], TOKEN)
    try:
        first = wire.receive(conn)
        assert torch.equal(first, batches[0])
        thread.join(5)  # the rank busy for 5 s: the worker's next sends wait on a zero window meanwhile
        got = [wire.receive(conn) for _ in batches[1:]]
    finally:
        thread.join(10)
        conn.close()
        listener.close()
    assert not failed, failed
    assert all(torch.equal(a, b) for a, b in zip(got, batches[1:], strict=True))
