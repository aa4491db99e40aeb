"""A pod's snapshots, handed to the ranks of its job that lack them (a replaced pod, a grown gang).

Over the same transport as the data workers (`wire`): a connection proves the job's token both ways
before anything is read, the snapshot's tensor bytes go as one out-of-band frame, and the receiver checks
them against the snapshot's checksum. A pod serves only while its gang recovers.
"""

from __future__ import annotations

import logging
import mmap
import socket
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from .. import wire
from ..errors import CorruptDataError
from .podsnapshots import Held, PodSnapshots, verified

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Fetched:
    held: Held
    data: memoryview  # the snapshot's bytes, writable (tensors are built on them)


class SnapshotServer:
    """Serves `snapshots` on `host` (an ephemeral port) to peers that prove `token`, until closed."""

    def __init__(self, snapshots: PodSnapshots, host: str, token: bytes) -> None:
        self.snapshots = snapshots
        self._listener = wire.listen(host, 0, token)
        self.port: int = self._listener.address[1]
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="ddp-snapshot-server", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn = wire.accept(self._listener)
            except OSError:  # closed
                return
            except Exception as error:  # noqa: BLE001 - a peer without the token: said, and the next one served
                if self._closed.is_set():
                    return  # close()'s own connection, which woke the accept
                log.warning("a connection to the snapshot server was refused: %s", error)
                continue
            threading.Thread(target=self._serve, args=(conn,), name="ddp-snapshot-send", daemon=True).start()

    def _serve(self, conn: Connection) -> None:
        import torch

        try:
            step = int(wire.receive(conn)["step"])
            held = next((h for h in self.snapshots.held() if h.step == step), None)
            if held is None:
                wire.send(conn, {"error": f"no snapshot of step {step} here"})
                return
            data = torch.empty(0, dtype=torch.uint8)
            if held.nbytes:
                with open(self.snapshots.directory / f"slot-{held.slot}.data", "rb") as file:
                    data = torch.frombuffer(mmap.mmap(file.fileno(), held.nbytes, access=mmap.ACCESS_COPY),
                                            dtype=torch.uint8)
            wire.send(conn, {"meta": held.meta(), "data": data})
        except (OSError, EOFError, ValueError, KeyError, TypeError) as error:
            log.warning("a snapshot could not be sent to a peer: %s", error)
        finally:
            conn.close()

    def close(self) -> None:
        self._closed.set()
        try:  # closing a socket does not wake a thread blocked in its accept(): a connection does
            socket.create_connection(self._listener.address, timeout=1).close()
        except OSError:
            pass
        self._thread.join(timeout=5)
        self._listener.close()

    def __enter__(self) -> SnapshotServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def fetch(host: str, port: int, token: bytes, step: int, slot: int = 0) -> Fetched:
    """The snapshot of `step` from the pod serving at host:port, verified. Raises OSError, EOFError or
    multiprocessing.AuthenticationError when the peer cannot be reached or refuses, CorruptDataError when
    what came does not match its checksum or the peer has no such snapshot."""
    conn = wire.connect(host, port, token)
    try:
        wire.send(conn, {"step": step})
        answer: dict[str, Any] = wire.receive(conn)
    finally:
        conn.close()
    if "error" in answer:
        raise CorruptDataError(f"{host}:{port}: {answer['error']}")
    held = Held.from_meta(slot, answer["meta"])
    data = memoryview(answer["data"].numpy()).cast("B")
    verified(held, data, f"the pod at {host}")
    return Fetched(held, data)
