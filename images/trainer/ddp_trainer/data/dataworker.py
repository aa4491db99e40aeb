"""A data worker: the process that makes a rank's batches on another machine.

A rank's loader (loader.py) has `num_workers` logical workers, as a local DataLoader has worker
processes; each becomes a session here, over a connection of its own, and a session is what a local
DataLoader worker would be: seeded the same way from the loader's base seed and its worker id, with
`get_worker_info()` and `worker_init_fn` as there, fetching and collating the batches it is sent in
the order sent. So the batches are those a local DataLoader would make, random augmentation included.
After each batch the session sends its random state (Python's, torch's and numpy's) with it: a
session started again elsewhere from that state (its worker lost) makes the next batches exactly as
the lost one would have.

`python -m ddp_trainer data-worker` serves sessions, one process each, until stopped.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import queue
import random
import signal
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any

import torch
from torch._utils import ExceptionWrapper
from torch.utils.data import _DatasetKind
from torch.utils.data._utils import worker as torch_worker

from .. import env, wire

log = logging.getLogger(__name__)

# (Python's random state, torch's CPU generator state, numpy's global state or None)
RandomState = tuple[Any, torch.Tensor, Any]


@dataclass
class Setup:
    """What a logical worker is: everything a local DataLoader hands its worker process."""

    dataset: Any
    dataset_kind: int
    auto_collation: bool
    collate_fn: Callable[[Any], Any] | None
    drop_last: bool
    base_seed: int
    worker_id: int
    num_workers: int
    worker_init_fn: Callable[[int], None] | None
    state: RandomState | None = None  # where to go on from; None: from the seed, as a new worker
    # The rank's sys.path: a script's folder (`script.py:function` is imported from it) is there, so its
    # dataset classes unpickle on a data worker whose pod mounts the same code.
    paths: tuple[str, ...] = ()
    # An iterable dataset's stream cannot be set to a random state mid-way: a worker started again
    # elsewhere starts its epoch again from `state` (the epoch's start) and makes, and drops, the
    # `skip` batches it had delivered (each asked for with `skip_index`).
    skip: int = 0
    skip_index: Any = None

    def without_code(self) -> Setup:
        """The setup less what `code()` holds, which is sent apart (encoded once for every worker)."""
        return replace(self, dataset=None, collate_fn=None, worker_init_fn=None)

    def code(self) -> tuple[Any, Callable[[Any], Any] | None, Callable[[int], None] | None]:
        return self.dataset, self.collate_fn, self.worker_init_fn

    def with_code(self, code: tuple[Any, Any, Any]) -> Setup:
        dataset, collate_fn, worker_init_fn = code
        return replace(self, dataset=dataset, collate_fn=collate_fn, worker_init_fn=worker_init_fn)


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:  # pragma: no cover - torch's wheels bring numpy
        return None
    return numpy


def random_state() -> RandomState:
    numpy = _numpy()
    return random.getstate(), torch.get_rng_state(), numpy.random.get_state() if numpy else None


def set_random_state(state: RandomState) -> None:
    python, torch_state, numpy_state = state
    random.setstate(python)
    torch.set_rng_state(torch_state)
    numpy = _numpy()
    if numpy is not None and numpy_state is not None:
        numpy.random.set_state(numpy_state)


class Session:
    """One logical worker, in this process: `start` once, then `fetch` each batch in order.

    Seeding follows torch's own worker loop (torch/utils/data/_utils/worker.py), so a session's
    random streams are those of the local worker with the same base seed and id."""

    def __init__(self, setup: Setup, where: str) -> None:
        self.setup = setup
        self.where = where
        seed = setup.base_seed + setup.worker_id
        random.seed(seed)
        torch.manual_seed(seed)
        numpy = _numpy()
        if numpy is not None:
            numpy.random.seed(torch_worker._generate_state(setup.base_seed, setup.worker_id))
        torch_worker._worker_info = torch_worker.WorkerInfo(
            id=setup.worker_id, num_workers=setup.num_workers, seed=seed, dataset=setup.dataset)
        if setup.worker_init_fn is not None:
            setup.worker_init_fn(setup.worker_id)
        if setup.state is not None:
            set_random_state(setup.state)
        self.fetcher = self._fetcher()  # an iterable dataset's iterator starts here, from this state
        for _ in range(setup.skip):
            self.fetch(setup.skip_index)

    def _fetcher(self) -> Any:
        setup = self.setup
        return _DatasetKind.create_fetcher(
            setup.dataset_kind, setup.dataset, setup.auto_collation, setup.collate_fn, setup.drop_last)

    def resume(self, code: tuple[Any, Any, Any]) -> None:
        """The next epoch of a persistent worker over an iterable dataset: a new iterator, as torch's
        worker makes one, over the rank's dataset as it is now (its epoch, which a local worker sees
        through shared memory where the dataset keeps it there, as ShardStream does)."""
        self.setup = self.setup.with_code(code)
        info = torch_worker._worker_info
        if info is not None:
            torch_worker._worker_info = torch_worker.WorkerInfo(
                id=info.id, num_workers=info.num_workers, seed=info.seed, dataset=self.setup.dataset)
        self.fetcher = self._fetcher()

    def fetch(self, index: Any) -> tuple[str, Any, RandomState]:
        """("data", batch, state after it), ("error", ExceptionWrapper naming the samples, state), or
        ("stop", None, state): an iterable dataset's stream has ended for this worker."""
        try:
            data: Any = self.fetcher.fetch(index)
            kind = "data"
        except StopIteration:
            data, kind = None, "stop"
        except Exception:  # noqa: BLE001 - the rank raises it, as a local DataLoader would
            data, kind = ExceptionWrapper(where=f"in {self.where} fetching samples {index}"), "error"
        return kind, data, random_state()


def serve_session(conn: Connection, where: str) -> None:
    """Runs one logical worker for one connection until the rank stops it or goes away."""
    torch.set_num_threads(1)  # as torch's local workers: each session is one core's work
    try:
        message = wire.receive(conn)
        if message[0] != "start":
            raise ValueError(f"a session starts with 'start', not {message[0]!r}")
        try:
            _extend_path(message[1].paths)
            setup: Setup = message[1].with_code(wire.receive(conn))
            session = Session(setup, f"{where}, logical worker {setup.worker_id}")
        except Exception:  # noqa: BLE001
            wire.send(conn, ("error", -1, ExceptionWrapper(where=f"starting {where}"), None))  # the rank raises it
            return
        log.info("serving logical worker %d of %d (base seed %d)", setup.worker_id, setup.num_workers,
                 setup.base_seed)
        wire.send(conn, ("ready",))
        with _Sender(conn) as sender:
            while not sender.failed and (message := wire.receive(conn))[0] in ("fetch", "resume"):
                if message[0] == "resume":
                    session.resume(wire.receive(conn))
                    continue
                _, seq, index = message
                kind, data, state = session.fetch(index)
                sender.put((kind, seq, data, state))
    except (EOFError, ConnectionError):
        pass
    finally:
        conn.close()


class _Sender:
    """A session's answers, sent from a thread of their own: a batch waits in the socket until the rank
    reads it (its turn comes round once per num_workers batches), and meanwhile the session makes the
    next one, as a local worker does while its last batch waits in shared memory. At most QUEUED
    answers wait here besides the one being sent; the rank asks for no more than prefetch_factor."""

    QUEUED = 2

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.failed = False  # the connection broke: the session ends
        self.queue: queue.Queue[tuple[Any, ...] | None] = queue.Queue(maxsize=self.QUEUED)
        self.thread = threading.Thread(target=self._run, name="data-worker-sender", daemon=True)
        self.thread.start()

    def put(self, message: tuple[Any, ...]) -> None:
        self.queue.put(message)

    def _run(self) -> None:
        while (message := self.queue.get()) is not None:
            if self.failed:
                continue  # drained, so a put never waits on a sender that stopped sending
            try:
                wire.send(self.conn, message)
            except OSError:
                self.failed = True
                _unblock(self.conn)

    def __enter__(self) -> _Sender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.queue.put(None)
        self.thread.join()


def _unblock(conn: Connection) -> None:
    """Ends the session's wait for the rank's next message (its receive sees the connection end)."""
    try:
        with socket.socket(fileno=os.dup(conn.fileno())) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _extend_path(paths: Sequence[str]) -> None:
    """The rank's sys.path entries this machine has too and lacks, in front, in the rank's order."""
    missing = [p for p in paths if p and p not in sys.path and os.path.isdir(p)]
    sys.path[:0] = missing


def serve(host: str, port: int, token: bytes, ready: Callable[[int], None] | None = None) -> None:
    """Accepts sessions on host:port until SIGTERM; each runs in a process of its own (forked, so the
    job's code imported here is imported there). ready(port) once listening."""
    context = multiprocessing.get_context("fork")
    with wire.listen(host, port, token) as listener:
        address = listener.address
        where = f"data worker {os.environ.get('HOSTNAME', address[0])}"
        log.info("data worker listening on %s:%d", *address)
        if ready is not None:
            ready(address[1])
        while True:
            try:
                conn = wire.accept(listener)
            except multiprocessing.AuthenticationError as error:
                log.warning("refused a connection that did not prove the job's token: %s", error)
                continue
            except OSError as error:
                log.warning("accepting a connection failed: %s", error)
                continue
            process = context.Process(target=serve_session, args=(conn, where), daemon=True)
            process.start()
            conn.close()
            _reap()


def _reap() -> None:
    for child in multiprocessing.active_children():  # joins those that ended
        del child


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddp_trainer data-worker",
                                     description="Serve a rank's DataLoader workers on this machine.")
    parser.add_argument("--host", default=os.environ.get(env.names.POD_IP, "127.0.0.1"),
                        help="address to listen on (default: $POD_IP, else 127.0.0.1)")
    parser.add_argument("--port", type=int, default=env.data_worker_port(), help="port (0: any free one)")
    args = parser.parse_args(argv)
    token = env.data_worker_token()
    if token is None:
        print(f"ddp-trainer data-worker: ${env.names.DATA_WORKER_TOKEN} is not set: without the job's token "
              "no rank could connect", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    serve(args.host, args.port, token)
    return 0
