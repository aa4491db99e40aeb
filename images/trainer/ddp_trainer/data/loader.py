"""`DataLoader`: torch's, whose worker processes run on the job's data workers when it has them.

It takes torch's arguments and is torch's DataLoader wherever it can be: without data workers
(`spec.dataWorkers` unset, `distribute_mode=False`, `num_workers=0`) it is exactly that. With them,
its `num_workers` logical workers run on the data worker pods instead of as processes here
(dataworker.py): the sampler, the base seed and which worker makes which batch are torch's own
(batch i by worker i mod num_workers, each seeded from the base seed and its id), so a rank receives
the batches a local DataLoader with the same arguments would have made, in the same order,
augmentation included. At most `prefetch_factor` batches per logical worker are in flight.

A logical worker whose data worker goes away (pod deleted, OOM-killed, evicted, unreachable) goes
on at another data worker from the random state the lost one sent with its last batch, and the
batches it owed are asked again; with none reachable within DATA_WORKER_WAIT_SECONDS it goes on in
this process. Either way the batches stay those a local DataLoader makes.

An iterable dataset (ShardStream, or the user's) runs in each logical worker as in a local worker
process (its own copy, `get_worker_info()` to split the stream); batches go to the workers still
streaming in turn, as torch's iterator hands them out. Its stream cannot be set to a random state
mid-way, so a logical worker moved elsewhere starts its epoch again and drops the batches it had
already delivered. A persistent worker's next epoch iterates the rank's dataset as it is then.

`DpexDataLoader` is Dpex's name for it; its `distribute_mode` (and `head_address`, which
names a Ray cluster there and nothing here) are accepted.
"""

from __future__ import annotations

import collections
import logging
import pickle
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any, TypeVar

from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import _DatasetKind
from torch.utils.data._utils import worker as torch_worker
from torch.utils.data._utils.pin_memory import pin_memory
from torch.utils.data.dataloader import _BaseDataLoaderIter

from .. import env, wire
from ..errors import ConfigError
from . import awaited
from .dataworker import RandomState, Session, Setup, random_state, set_random_state

log = logging.getLogger(__name__)
_T_co = TypeVar("_T_co", covariant=True)
T = TypeVar("T")

# How long a logical worker whose data worker went away tries the others (and the replacement the
# operator makes) before it goes on in this process.
DATA_WORKER_WAIT_SECONDS = 60.0
# A data worker that has not answered a batch for this long is taken for lost.
ANSWER_SECONDS = 300.0


class DataWorkerLost(Exception):
    pass


@contextmanager
def _rank_state_aside() -> Iterator[None]:
    """The rank's random state and worker info, as they were before the block, after it."""
    rank_state, rank_info = random_state(), torch_worker._worker_info
    try:
        yield
    finally:
        set_random_state(rank_state)
        torch_worker._worker_info = rank_info


class _InProcess:
    """A logical worker run in this process: the rank's own random state is set aside around it."""

    def __init__(self, setup: Setup) -> None:
        with _rank_state_aside():
            self.session = Session(setup, "this rank's process (no data worker reachable)")
            self.state = random_state()
            self.info = torch_worker._worker_info

    def fetch(self, index: Any) -> tuple[str, Any, RandomState]:
        kind, data, _ = self._as_worker(lambda: self.session.fetch(index))
        return kind, data, self.state

    def resume(self, code: tuple[Any, Any, Any]) -> None:
        self._as_worker(lambda: self.session.resume(code))

    def _as_worker(self, work: Callable[[], T]) -> T:
        """work(), with this worker's random state and worker info in place of the rank's."""
        with _rank_state_aside():
            set_random_state(self.state)
            torch_worker._worker_info = self.info
            done = work()
            self.state, self.info = random_state(), torch_worker._worker_info
        return done


class LogicalWorker:
    """Worker `worker_id` of one iterator: where it runs, what it owes, and its random state."""

    def __init__(self, setup: Setup, code: list[memoryview | bytes], endpoints: Sequence[str], token: bytes) -> None:
        """code: the setup's dataset, collate_fn and worker_init_fn, encoded (once for every worker)."""
        self.setup = setup
        self.code = code
        self.iterable = setup.dataset_kind == _DatasetKind.Iterable
        self.delivered = 0  # batches (or errors) taken this epoch
        self.epoch_state: RandomState | None = None  # at this epoch's start; None: from the seed
        self.endpoints = list(endpoints)
        self.token = token
        self.next_endpoint = setup.worker_id % len(self.endpoints)
        self.owed: collections.deque[tuple[int, Any]] = collections.deque()  # (seq, index), in order
        self.state: RandomState | None = None  # after its last batch received
        self.conn: Connection | None = None
        self.where = ""
        self.local: _InProcess | None = None

    def put(self, seq: int, index: Any) -> None:
        self.setup.skip_index = index  # an iterable dataset's indices are all alike (placeholders)
        self.owed.append((seq, index))
        if self.local is None:
            self._send_or_move(("fetch", seq, index))

    def take(self, seq: int) -> tuple[str, Any]:
        """Batch `seq`, the first this worker owes: ("data", batch) or ("error", ExceptionWrapper)."""
        first, index = self.owed[0]
        if first != seq:
            raise AssertionError(f"logical worker {self.setup.worker_id} asked for batch {seq} before {first}")
        while True:
            if self.local is not None:
                kind, data, self.state = self.local.fetch(index)
                break
            try:
                with awaited.waiting_on(f"{self.where} (logical worker {self.setup.worker_id}) for batch {seq}"):
                    message = self._receive()
            except DataWorkerLost as lost:
                self._move(str(lost))
                continue
            kind, got, data, state = message
            if got != seq:
                raise AssertionError(f"{self.where} answered batch {got} for {seq}")
            self.state = state
            break
        self.owed.popleft()
        if kind != "stop":
            self.delivered += 1
        return kind, data

    def drain(self) -> None:
        """Takes what this worker still owes: after its iterable stream ended, only more ends."""
        while self.owed:
            self.take(self.owed[0][0])

    def resume(self, setup: Setup, code: list[memoryview | bytes]) -> None:
        """The next epoch of a persistent worker over an iterable dataset (setup: the rank's dataset now)."""
        self.setup, self.code = replace(setup, worker_id=self.setup.worker_id), code
        self.delivered, self.epoch_state = 0, self.state
        if self.local is not None:
            self.local.resume(setup.code())
            return
        if self.conn is None:
            self._move("not connected")
            return
        try:
            wire.send(self.conn, ("resume",), code)
        except OSError as error:
            self._move(f"{self.where} went away ({error})")

    def close(self) -> None:
        if self.conn is not None:
            try:
                wire.send(self.conn, ("stop",))
            except OSError:
                pass
            self.conn.close()
            self.conn = None

    def _receive(self) -> Any:
        if self.conn is None:
            raise DataWorkerLost("not connected")
        try:
            if not self.conn.poll(ANSWER_SECONDS):
                raise DataWorkerLost(f"{self.where} did not answer for {ANSWER_SECONDS:g} s")
            return wire.receive(self.conn)
        except (EOFError, OSError) as error:
            raise DataWorkerLost(f"{self.where} went away ({type(error).__name__}: {error})") from error

    def _send_or_move(self, message: tuple[Any, ...]) -> None:
        if self.conn is None:
            self._move("not yet connected")
            return
        try:
            wire.send(self.conn, message)
        except OSError as error:
            self._move(f"{self.where} went away ({error})")

    def _move(self, why: str) -> None:
        """Starts this worker again at the next data worker that answers, from its last state, and asks
        there for what it owes; in this process if none answers within DATA_WORKER_WAIT_SECONDS."""
        if self.conn is not None:
            self.conn.close()
            self.conn = None
            log.warning("logical data worker %d: %s; going on elsewhere", self.setup.worker_id, why)
        setup = replace(self.setup, state=self.epoch_state, skip=self.delivered) if self.iterable \
            else replace(self.setup, state=self.state)
        deadline = time.monotonic() + DATA_WORKER_WAIT_SECONDS
        delay = 0.2
        while True:
            for _ in range(len(self.endpoints)):
                address = self.endpoints[self.next_endpoint]
                self.next_endpoint = (self.next_endpoint + 1) % len(self.endpoints)
                conn = self._start(address, setup)
                if conn is not None:
                    self.conn, self.where = conn, f"data worker {address}"
                    for seq, index in self.owed:
                        wire.send(conn, ("fetch", seq, index))
                    return
            if time.monotonic() >= deadline:
                break
            time.sleep(delay)  # the operator is replacing the pod: try again, backing off
            delay = min(delay * 2, 5.0)
        log.warning("logical data worker %d: no data worker answered for %g s; it goes on in this process",
                    self.setup.worker_id, DATA_WORKER_WAIT_SECONDS)
        self.local = _InProcess(setup)

    def _start(self, address: str, setup: Setup) -> Connection | None:
        host, port = wire.parse_address(address)
        try:
            conn = wire.connect(host, port, self.token)
        except OSError as error:
            log.debug("data worker %s: %s", address, error)
            return None
        try:
            wire.send(conn, ("start", setup.without_code()), self.code)
            with awaited.waiting_on(f"data worker {address} to start logical worker {setup.worker_id}"):
                answer = wire.receive(conn) if conn.poll(ANSWER_SECONDS) else None
        except (EOFError, OSError):
            answer = None
        if answer is None:
            conn.close()
            return None
        if answer[0] == "error":  # the dataset or worker_init_fn raised there: it would here too
            conn.close()
            answer[2].reraise()
        return conn


def _encode_code(setup: Setup) -> list[memoryview | bytes]:
    try:
        return wire.encode(setup.code())
    except (pickle.PicklingError, TypeError, AttributeError) as error:
        raise ConfigError(f"the DataLoader's dataset, collate_fn or worker_init_fn cannot be sent to the data "
                          f"workers ({error}): define them at a module's top level, as a DataLoader with "
                          "the spawn start method needs too") from error


class _RemoteIter(_BaseDataLoaderIter):
    """torch's multiprocessing iterator's dispatch (prefetch_factor x num_workers in flight, batch i
    to worker i mod num_workers, results in order), with the workers elsewhere."""

    def __init__(self, loader: DataLoader[Any], endpoints: Sequence[str], token: bytes) -> None:
        super().__init__(loader)
        self._prefetch = loader.prefetch_factor or 2
        self._loader = loader
        base = self._setup()
        code = _encode_code(base)
        self._workers = [LogicalWorker(replace(base, worker_id=w), code, endpoints, token)
                         for w in range(self._num_workers)]
        self._reset(loader, first_iter=True)

    def _setup(self) -> Setup:
        return Setup(dataset=self._dataset, dataset_kind=self._dataset_kind, auto_collation=self._auto_collation,
                     collate_fn=self._collate_fn, drop_last=self._drop_last, base_seed=int(self._base_seed),
                     worker_id=0, num_workers=self._num_workers, worker_init_fn=self._loader.worker_init_fn,
                     paths=tuple(sys.path))

    def _reset(self, loader: TorchDataLoader[Any], first_iter: bool = False) -> None:
        super()._reset(loader, first_iter)
        self._send_idx = 0
        self._rcvd_idx = 0
        self._task_worker: dict[int, int] = {}  # batch -> the logical worker making it
        self._active = [True] * self._num_workers  # an iterable dataset's worker is not once its stream ended
        self._next_worker = 0
        if not first_iter and self._dataset_kind == _DatasetKind.Iterable:  # a persistent iterator's next epoch
            setup = self._setup()
            code = _encode_code(setup)
            for worker in self._workers:
                worker.resume(setup, code)
        for _ in range(self._prefetch * self._num_workers):
            self._try_put()

    def _try_put(self) -> None:
        """The next batch to the next worker still active, in turn (torch's _try_put_index)."""
        try:
            index = self._next_index()
        except StopIteration:
            return
        for _ in range(self._num_workers):
            worker = self._next_worker
            self._next_worker = (worker + 1) % self._num_workers
            if self._active[worker]:
                break
        else:
            return
        self._workers[worker].put(self._send_idx, index)
        self._task_worker[self._send_idx] = worker
        self._send_idx += 1

    def _next_data(self) -> Any:
        kind, data = self._next_taken()
        self._try_put()
        if kind == "error":  # raised here, as torch's iterator does; the next batch may still be asked for
            data.reraise()
        if self._pin_memory:
            data = pin_memory(data, self._pin_memory_device)
        return data

    def _next_taken(self) -> tuple[str, Any]:
        """The next batch in order ("data" or "error"), past those asked of workers whose stream ended."""
        while True:
            while self._rcvd_idx < self._send_idx and not self._active[self._task_worker[self._rcvd_idx]]:
                del self._task_worker[self._rcvd_idx]  # asked of a worker whose stream had ended
                self._rcvd_idx += 1
            if self._rcvd_idx >= self._send_idx:
                if not self._persistent_workers:
                    self._shutdown()
                raise StopIteration
            worker = self._task_worker.pop(self._rcvd_idx)
            kind, data = self._workers[worker].take(self._rcvd_idx)
            self._rcvd_idx += 1
            if kind != "stop":
                return kind, data
            self._active[worker] = False
            self._workers[worker].drain()
            self._try_put()

    def _shutdown(self) -> None:
        for worker in self._workers:
            worker.close()

    def __del__(self) -> None:
        if hasattr(self, "_workers"):
            self._shutdown()


class DataLoader(TorchDataLoader[_T_co]):
    """torch.utils.data.DataLoader, same arguments; `distribute_mode`: None (default) uses the job's
    data workers when it has them, False never, True says so in the log when there are none;
    `data_workers` (host:port each) and `data_worker_token` default to what the operator injects."""

    def __init__(self, dataset: Any, *args: Any, distribute_mode: bool | None = None,
                 data_workers: Sequence[str] | None = None, data_worker_token: str | bytes | None = None,
                 **kwargs: Any) -> None:
        super().__init__(dataset, *args, **kwargs)
        self.distribute_mode = distribute_mode
        self.data_workers = list(data_workers) if data_workers is not None else None
        self.data_worker_token = data_worker_token.encode() if isinstance(data_worker_token, str) else data_worker_token

    def remote_endpoints(self) -> list[str]:
        """The data workers this loader's workers run on; empty when they run here."""
        if self.distribute_mode is False:
            return []
        endpoints = self.data_workers if self.data_workers is not None else env.data_workers()
        for address in endpoints:
            wire.parse_address(address)
        why_local = _why_local(endpoints, self.num_workers)
        if why_local:
            if endpoints or self.distribute_mode:
                _say_once(f"DataLoader workers run in this pod: {why_local}")
            return []
        return endpoints

    def _get_iterator(self) -> Any:
        endpoints = self.remote_endpoints()
        if not endpoints:
            return super()._get_iterator()
        token = self.data_worker_token or env.data_worker_token()
        if token is None:
            raise ConfigError(f"data workers {', '.join(endpoints)} are set but ${env.names.DATA_WORKER_TOKEN} "
                              "is not: the loader cannot prove it belongs to the job")
        return _RemoteIter(self, endpoints, token)


def _why_local(endpoints: Sequence[str], num_workers: int) -> str | None:
    if not endpoints:
        return "the job has no data workers (spec.dataWorkers)"
    if num_workers == 0:
        return "num_workers=0 makes every batch in the rank's own process; set num_workers to use data workers"
    return None


_SAID: set[str] = set()


def _say_once(message: str) -> None:
    if message not in _SAID:
        _SAID.add(message)
        log.warning(message)


class DpexDataLoader(DataLoader[_T_co]):
    """Dpex's DpexDataLoader: `distribute_mode=True` runs its workers on the job's data
    workers, False here; `head_address` (a Ray cluster's, there) is accepted and unused."""

    def __init__(self, dataset: Any, distribute_mode: bool | None = False, head_address: str = "auto",
                 *args: Any, **kwargs: Any) -> None:
        del head_address
        super().__init__(dataset, *args, distribute_mode=distribute_mode, **kwargs)

