"""How a rank's loader and a data worker talk.

The transport is the standard library's `multiprocessing.connection`: length-prefixed messages over
TCP, and a challenge-response on connect in both directions with the job's token (HMAC), so only a
process holding the token can connect, and nothing is read from a peer before it has proven it
holds it. On top of that, one message is a few frames: the frames' sizes, the message's structure
pickled with protocol 5, then every tensor's bytes as a frame of its own (pickle's out-of-band
buffers): a tensor's storage is never pickled, and is received straight into the buffer it is
rebuilt on. Only peers of the same job (the token) send pickles, and both sides run the job's code.

A data worker that vanishes without closing its connection (a pod deleted at once, a node gone:
nothing answers on its address any more) is noticed by the rank in about DEAD_PEER_SECONDS, by TCP
keepalive and TCP_USER_TIMEOUT, and a connect gives up after CONNECT_SECONDS: a rank never waits out
a batch's whole answer time (or the kernel's two-minute connect) on a data worker that is gone.
"""

from __future__ import annotations

import io
import os
import pickle
import socket
import struct
from collections.abc import Sequence
from multiprocessing.connection import Connection, Listener, answer_challenge, deliver_challenge
from typing import Any

import torch

SIZES = struct.Struct("<Q")
CONNECT_SECONDS = 10.0
DEAD_PEER_SECONDS = 15


def _rebuild(buffer: bytearray | memoryview, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    if len(buffer) == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(buffer, dtype=torch.uint8).view(dtype).reshape(shape)


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        # Plain dense tensors only: a subclass (torchvision's tv_tensors) keeps its own pickling.
        if type(obj) is not torch.Tensor or obj.layout != torch.strided or obj.is_quantized:
            return NotImplemented
        flat = obj.detach().cpu().contiguous().reshape(-1)
        raw = flat.view(torch.uint8).numpy().data if flat.numel() else memoryview(bytearray())
        return _rebuild, (pickle.PickleBuffer(raw), obj.dtype, tuple(obj.shape))


def encode(message: object) -> list[memoryview | bytes]:
    """A message as frames: the sizes of the rest, its pickled structure, each tensor's bytes."""
    buffers: list[pickle.PickleBuffer] = []
    out = io.BytesIO()
    _Pickler(out, protocol=5, buffer_callback=buffers.append).dump(message)
    frames: list[memoryview | bytes] = [out.getbuffer(), *(b.raw() for b in buffers)]
    sizes = b"".join(SIZES.pack(len(f) if isinstance(f, bytes) else f.nbytes) for f in frames)
    return [sizes, *frames]


def send(conn: Connection, message: object, then: Sequence[memoryview | bytes] = ()) -> None:
    """The message, and right after it `then`: another message encoded before (once for many peers)."""
    for frame in [*encode(message), *then]:
        conn.send_bytes(frame)


def receive(conn: Connection) -> Any:
    """The next message; EOFError when the peer has gone."""
    sizes = [size for (size,) in SIZES.iter_unpack(conn.recv_bytes())]
    frames = [_receive_into(conn, bytearray(size)) for size in sizes]
    return pickle.loads(frames[0], buffers=frames[1:])


# multiprocessing.connection's length prefix: "!i", or -1 then "!Q" past 2 GiB (Connection._send_bytes).
_LENGTH, _LONG_LENGTH = struct.Struct("!i"), struct.Struct("!Q")


def _receive_into(conn: Connection, frame: bytearray) -> bytearray:
    """One message of `conn` read straight into `frame` (its exact size). Connection.recv_bytes_into
    reads through a BytesIO, two more copies of every byte: 1.3 ms of CPU a MB against 0.2 here
    (loopback, 9.6 MB batches), which at a few hundred images a second is a small rank's whole CPU.
    The connection buffers nothing of its own, so its next recv_bytes goes on from here."""
    fd = conn.fileno()
    (size,) = _LENGTH.unpack(_read_exactly(fd, bytearray(_LENGTH.size)))
    if size == -1:
        (size,) = _LONG_LENGTH.unpack(_read_exactly(fd, bytearray(_LONG_LENGTH.size)))
    if size != len(frame):
        raise ValueError(f"a frame of {size} bytes came where {len(frame)} were announced")
    return _read_exactly(fd, frame)


def _read_exactly(fd: int, buffer: bytearray) -> bytearray:
    view = memoryview(buffer)
    while view.nbytes:
        got = os.readv(fd, [view])
        if got == 0:
            raise EOFError("the peer closed the connection mid-message")
        view = view[got:]
    return buffer


def listen(host: str, port: int, token: bytes) -> Listener:
    return Listener((host, port), family="AF_INET", authkey=token)


def accept(listener: Listener) -> Connection:
    """The next connection that proved the token (multiprocessing.AuthenticationError if it did not)."""
    conn = listener.accept()
    with socket.fromfd(conn.fileno(), socket.AF_INET, socket.SOCK_STREAM) as sock:  # a duplicate of its socket
        notice_dead_peer(sock, sending_batches=True)
    return conn


def connect(host: str, port: int, token: bytes) -> Connection:
    """Connects (within CONNECT_SECONDS) and proves the token both ways, as multiprocessing's Client
    does (multiprocessing.AuthenticationError if either side lacks it)."""
    sock = socket.create_connection((host, port), timeout=CONNECT_SECONDS)
    sock.settimeout(None)
    notice_dead_peer(sock)
    conn = Connection(sock.detach())
    try:
        answer_challenge(conn, token)
        deliver_challenge(conn, token)
    except BaseException:
        conn.close()
        raise
    return conn


def notice_dead_peer(sock: socket.socket, sending_batches: bool = False) -> None:
    """Keepalive probes after 5 s idle, 2 s apart, and (the rank's side) data unacknowledged for
    DEAD_PEER_SECONDS: the connection then fails (ETIMEDOUT) instead of waiting on a peer that is gone.

    Not TCP_USER_TIMEOUT on a data worker's side (`sending_batches`): its batches wait in a full socket
    (a zero window) for as long as the rank takes to read them, which is no sign of a lost rank, and
    Linux ends a connection whose zero-window probes outlast TCP_USER_TIMEOUT."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    options = [("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 2), ("TCP_KEEPCNT", 5)]
    if not sending_batches:
        options.append(("TCP_USER_TIMEOUT", DEAD_PEER_SECONDS * 1000))
    for option, value in options:
        if hasattr(socket, option):  # Linux has them all
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


def parse_address(address: str) -> tuple[str, int]:
    """`host:port` (a DNS name, an IPv4 address, or an IPv6 one in brackets)."""
    host, sep, port = address.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"data worker address {address!r} is not host:port")
    return host.strip("[]"), int(port)
