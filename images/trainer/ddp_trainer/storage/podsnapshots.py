"""The newest training state kept in the pod's memory, outside the rank processes, so that a rank process
restarted in place (or a peer pod that lost its own) takes it up again without reading S3.

One directory per pod (`/dev/shm/ddp-snapshots`: memory, and charged to the pod's memory cgroup), written
by the pod's first rank process (in DDP every rank holds the same state), two slots in turn:

    slot-<k>.data   the state's tensor bytes, each storage at a 64-byte aligned offset
    slot-<k>.json   written last: step, attempt, the pickled structure (statebytes), each storage's
                    offset and size, and the data's checksum
    reached         the newest step the training loop reported (8 bytes), for the steps a restart lost

A slot is overwritten only while the other one holds the newest snapshot, and its `.json` is removed
before its data is touched: a process killed mid-copy leaves the other slot as the newest, never a torn
one that looks whole. Taking a snapshot copies the tensors the optimizer does not own at once and the
optimizer's (its parameters and its state, most of the bytes) on a thread while the next step's forward and
backward run: every optimizer's `step()` waits until that copy is done, so none of them changes under it.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import queue
import struct
import threading
import time
import weakref
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from ..errors import CorruptDataError
from .statebytes import Split, join, split

log = logging.getLogger(__name__)

SLOTS = (0, 1)
ALIGN = 64
REACHED = "reached"
_REACHED = struct.Struct("<q")
CHECKSUM_CHUNK = 64 << 20
# States smaller than this are copied and committed at once: a thread that copies the optimizer's tensors
# while the next step runs costs a small model more (the wake-up, and two cores shared) than the copy.
OVERLAP_FROM = 16 << 20
# Room kept free of snapshots in the pod's memory limit, for the rank processes' own growth.
MEMORY_HEADROOM = 0.10


@dataclass(frozen=True)
class Held:
    """A committed snapshot in this pod's directory."""

    step: int
    slot: int
    attempt: int
    nbytes: int
    layout: tuple[tuple[int, int], ...]  # (offset, size) of each storage in the slot's data
    structure: bytes
    checksum: str
    created: float

    def meta(self) -> dict[str, Any]:
        return {"version": 1, "step": self.step, "attempt": self.attempt, "nbytes": self.nbytes,
                "layout": [list(place) for place in self.layout],
                "structure": base64.b64encode(self.structure).decode(), "checksum": self.checksum,
                "created": self.created}

    @classmethod
    def from_meta(cls, slot: int, meta: dict[str, Any]) -> Held:
        return cls(step=int(meta["step"]), slot=slot, attempt=int(meta["attempt"]), nbytes=int(meta["nbytes"]),
                   layout=tuple((int(offset), int(size)) for offset, size in meta["layout"]),
                   structure=base64.b64decode(meta["structure"]), checksum=str(meta["checksum"]),
                   created=float(meta["created"]))


def layout_of(sizes: Iterable[int]) -> tuple[tuple[tuple[int, int], ...], int]:
    """Each storage's (offset, size) in a slot, aligned, and the slot's size."""
    places, end = [], 0
    for size in sizes:
        places.append((end, size))
        end += -(-size // ALIGN) * ALIGN
    return tuple(places), end


def crc32c_function() -> Callable[[Any, int], int] | None:
    """The AWS CRT's hardware CRC32C (0.06 CPU-s a GB), None where awscrt is not installed."""
    try:
        from awscrt.checksums import crc32c
    except ImportError:
        return None
    return cast(Callable[[Any, int], int], crc32c)


def checksum(data: memoryview) -> str:
    """CRC32C where the AWS CRT is installed (the trainer image), else zlib's CRC32."""
    crc32c = crc32c_function()
    name, update = ("crc32c", crc32c) if crc32c is not None else ("crc32", zlib.crc32)
    crc = 0
    for at in range(0, data.nbytes, CHECKSUM_CHUNK):
        crc = update(data[at:at + CHECKSUM_CHUNK], crc)
    return f"{name}:{crc:08x}"


def verified(held: Held, data: bytearray | memoryview, where: str) -> None:
    if len(data) < held.nbytes or checksum(memoryview(data)[:held.nbytes]) != held.checksum:
        raise CorruptDataError(f"the snapshot of step {held.step} in {where} does not match its checksum")


def state_of(held: Held, data: bytearray | memoryview) -> Any:
    """The training state a snapshot's data (read whole into `data`) holds; its tensors share `data`."""
    import torch

    storages = [torch.frombuffer(data, dtype=torch.uint8, count=size, offset=offset).untyped_storage() if size
                else torch.UntypedStorage(0) for offset, size in held.layout]
    return join(held.structure, storages)


class PodSnapshots:
    """This pod's snapshot directory: what it holds, reading, pruning."""

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)
        self._reached_fd: int | None = None

    def _data(self, slot: int) -> Path:
        return self.directory / f"slot-{slot}.data"

    def _meta(self, slot: int) -> Path:
        return self.directory / f"slot-{slot}.json"

    def held(self) -> list[Held]:
        """The committed snapshots, newest first. One whose record cannot be read is left out (and said)."""
        found = []
        for slot in SLOTS:
            try:
                found.append(Held.from_meta(slot, json.loads(self._meta(slot).read_text())))
            except FileNotFoundError:
                continue
            except (OSError, ValueError, KeyError, TypeError) as error:
                log.warning("snapshot slot %d in %s is unreadable, left out: %s", slot, self.directory, error)
        return sorted(found, key=lambda held: held.step, reverse=True)

    def holds(self) -> int:
        """Bytes its slots take in memory now."""
        return sum(self._data(slot).stat().st_size for slot in SLOTS if self._data(slot).exists())

    def read(self, held: Held) -> bytearray:
        data = bytearray(held.nbytes)
        with open(self._data(held.slot), "rb", buffering=0) as file:
            view, got = memoryview(data), 0
            while got < held.nbytes:
                n = file.readinto(view[got:])
                if not n:
                    break
                got += n
        if got < held.nbytes:
            raise CorruptDataError(f"the snapshot of step {held.step} in {self.directory} has {got} of its "
                                   f"{held.nbytes} bytes")
        verified(held, data, str(self.directory))
        return data

    def load(self, held: Held) -> Any:
        return state_of(held, self.read(held))

    def uncommit(self, slot: int) -> None:
        self._meta(slot).unlink(missing_ok=True)

    def commit(self, held: Held) -> None:
        temporary = self._meta(held.slot).with_suffix(".json.tmp")
        temporary.write_text(json.dumps(held.meta()))
        os.replace(temporary, self._meta(held.slot))

    def prune_after(self, step: int) -> None:
        """Forget the snapshots newer than `step`: a gang that resumed at `step` abandoned them."""
        for held in self.held():
            if held.step > step:
                self.uncommit(held.slot)

    def clear(self) -> None:
        for slot in SLOTS:
            self.uncommit(slot)
            self._data(slot).unlink(missing_ok=True)
        if self._reached_fd is not None:
            os.close(self._reached_fd)
            self._reached_fd = None
        (self.directory / REACHED).unlink(missing_ok=True)

    def reached(self) -> int | None:
        try:
            raw = (self.directory / REACHED).read_bytes()
        except OSError:
            return None
        return _REACHED.unpack(raw)[0] if len(raw) == _REACHED.size else None

    def note_reached(self, step: int) -> None:
        """Called every step: the file stays open (a write of 8 bytes, a microsecond)."""
        if self._reached_fd is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._reached_fd = os.open(self.directory / REACHED, os.O_WRONLY | os.O_CREAT, 0o600)
        os.pwrite(self._reached_fd, _REACHED.pack(step), 0)

    def slot_to_write(self) -> int:
        """The slot not holding the newest snapshot."""
        held = self.held()
        return held[0].slot ^ 1 if held else SLOTS[0]

    def mapped(self, slot: int, nbytes: int) -> Any:
        """Slot `slot`'s data file, `nbytes` long, as a uint8 tensor on shared memory (writes go to the file)."""
        import torch

        self.directory.mkdir(parents=True, exist_ok=True)
        path = self._data(slot)
        with open(path, "ab") as file:
            file.truncate(nbytes)
            if nbytes:  # the memory taken now (ENOSPC here), not at a write into the mapping (SIGBUS)
                os.posix_fallocate(file.fileno(), 0, nbytes)
        return torch.from_file(str(path), shared=True, size=nbytes, dtype=torch.uint8)


# --- room ------------------------------------------------------------------------------------------

CGROUP_MEMORY = (  # limit and usage: v2, then v1
    (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory.current")),
    (Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"), Path("/sys/fs/cgroup/memory/memory.usage_in_bytes")),
)
NO_LIMIT = 1 << 60  # cgroup v1's "unlimited" is a page-rounded LONG_MAX


@dataclass(frozen=True)
class Room:
    free: int  # bytes free in the snapshot directory's filesystem
    memory_limit: int | None  # the container's memory limit, None where it has none
    memory_used: int | None


def room(directory: Path) -> Room:
    stat = os.statvfs(directory)
    limit = used = None
    for limit_file, used_file in CGROUP_MEMORY:
        try:
            raw = limit_file.read_text().strip()
            used = int(used_file.read_text().strip())
        except (OSError, ValueError):
            continue
        limit = None if raw == "max" or int(raw) >= NO_LIMIT else int(raw)
        break
    return Room(free=stat.f_bavail * stat.f_frsize, memory_limit=limit, memory_used=used)


def misfit(nbytes: int, held: int, room: Room, directory: Path) -> str | None:
    """Why two copies of a state of `nbytes` do not fit in the pod (None when they do), with `held` bytes
    of the snapshot directory already in use by earlier snapshots."""
    need = len(SLOTS) * layout_of([nbytes])[1]
    more = need - held
    if more > room.free:
        return (f"memory snapshots are off: {len(SLOTS)} copies of the training state ({_size(nbytes)} each) need "
                f"{_size(need)} in {directory}, which has {_size(room.free + held)} for them "
                f"(spec.shmSize sizes /dev/shm; give it at least {_size(need + (64 << 20))})")
    if room.memory_limit is not None and room.memory_used is not None:
        allowed = int(room.memory_limit * (1 - MEMORY_HEADROOM))
        if room.memory_used + more > allowed:
            return (f"memory snapshots are off: {len(SLOTS)} copies of the training state ({_size(nbytes)} each) "
                    f"would take the container's memory from {_size(room.memory_used)} to "
                    f"{_size(room.memory_used + more)}, past {_size(allowed)} (90% of its limit, "
                    f"{_size(room.memory_limit)}): raise spec.resources.limits.memory by at least "
                    f"{_size(room.memory_used + more - allowed)}")
    return None


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


# --- taking snapshots --------------------------------------------------------------------------------

_optimizers: weakref.WeakSet[Any] = weakref.WeakSet()
_copied = threading.Event()  # set while no snapshot copies from an optimizer's tensors
_copied.set()
_hooks_installed = False


def _install_hooks() -> None:
    """Learn which optimizers step (their tensors are copied on a thread) and hold each step until such
    a copy is done."""
    global _hooks_installed
    if _hooks_installed:
        return
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    def before_step(optimizer: Any, args: Any, kwargs: Any) -> None:
        _copied.wait()

    def after_step(optimizer: Any, args: Any, kwargs: Any) -> None:
        _optimizers.add(optimizer)

    register_optimizer_step_pre_hook(before_step)
    register_optimizer_step_post_hook(after_step)
    _hooks_installed = True


def optimizer_storages() -> set[int]:
    """The storages (C pointers) the optimizers that stepped so far change: their parameters and state."""
    import torch

    owned: set[int] = set()
    for optimizer in list(_optimizers):
        for group in optimizer.param_groups:
            owned.update(param.untyped_storage()._cdata for param in group["params"])
        for state in optimizer.state.values():
            owned.update(value.untyped_storage()._cdata for value in state.values() if isinstance(value, torch.Tensor))
    return owned


class SnapshotTaker:
    """Takes this process's snapshots into the pod's directory, at most one in flight."""

    def __init__(self, snapshots: PodSnapshots, attempt: int,
                 fits: Callable[[int, int], str | None] | None = None) -> None:
        """fits(nbytes, held): why a state of nbytes does not fit (None: it does); asked when the size changes."""
        self.snapshots = snapshots
        self.attempt = attempt
        self._fits = fits or (lambda nbytes, held: misfit(nbytes, held, room(snapshots.directory), snapshots.directory))
        self._maps: dict[int, Any] = {}
        self._checked: int | None = None
        self._newest: int | None = None  # the slot of the newest snapshot this process committed
        self._work: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._idle = threading.Event()  # set while no snapshot is in flight
        self._idle.set()
        self._worker: threading.Thread | None = None
        self._error: BaseException | None = None
        _install_hooks()

    def take(self, step: int, state: Any) -> None:
        """Keep `state` of `step`; returns once the tensors no optimizer owns are copied. Raises
        SnapshotsDoNotFit when two copies of it would not fit in the pod."""
        self.wait()
        parts = split(state)
        places, nbytes = layout_of(storage.nbytes() for storage in parts.storages)
        if nbytes != self._checked:
            self.snapshots.directory.mkdir(parents=True, exist_ok=True)
            reason = self._fits(nbytes, self.snapshots.holds())
            if reason is not None:
                raise SnapshotsDoNotFit(reason)
            self._checked = nbytes
        slot = self.snapshots.slot_to_write() if self._newest is None else self._newest ^ 1
        self.snapshots.uncommit(slot)
        flat = self._map(slot, nbytes)
        if nbytes < OVERLAP_FROM:  # done sooner than a thread would be woken
            _copy(flat, parts, places, range(len(parts.storages)))
            self._idle.clear()
            self._finish(step, slot, flat, parts, places, (), None)
            self.wait()
            return
        owned = optimizer_storages()
        later = [i for i, storage in enumerate(parts.storages) if storage._cdata in owned]
        now = sorted(set(range(len(parts.storages))) - set(later))
        _copy(flat, parts, places, now)
        event = _cuda_event(parts, later)
        _copied.clear()
        self._idle.clear()
        if self._worker is None:
            self._worker = threading.Thread(target=self._run, name="ddp-snapshot", daemon=True)
            self._worker.start()
        self._work.put(lambda: self._finish(step, slot, flat, parts, places, later, event))

    def _run(self) -> None:
        while True:
            self._work.get()()

    def _map(self, slot: int, nbytes: int) -> Any:
        mapped = self._maps.get(slot)
        if mapped is None or mapped.numel() != nbytes:
            mapped = self._maps[slot] = self.snapshots.mapped(slot, nbytes)
        return mapped

    def _finish(self, step: int, slot: int, flat: Any, parts: Split, places: Sequence[tuple[int, int]],
                later: Sequence[int], event: Any) -> None:
        try:
            try:
                _copy(flat, parts, places, later, after=event)
            finally:
                _copied.set()
            nbytes = flat.numel()
            held = Held(step=step, slot=slot, attempt=self.attempt, nbytes=nbytes, layout=tuple(places),
                        structure=parts.structure, checksum=checksum(memoryview(flat.numpy()).cast("B")),
                        created=time.time())
            self.snapshots.commit(held)
            self._newest = slot
        except BaseException as error:  # noqa: BLE001 - said by the next take() or wait()
            self._error = error
            self._newest = None  # read from the directory again
        finally:
            self._idle.set()

    def wait(self) -> None:
        """Until the snapshot in flight is committed; raises its error, if it had one."""
        self._idle.wait()
        error, self._error = self._error, None
        if error is not None:
            raise error


class SnapshotsDoNotFit(Exception):
    pass


def _copy(flat: Any, parts: Split, places: Sequence[tuple[int, int]], which: Iterable[int], after: Any = None) -> None:
    import torch

    def copy_all() -> None:
        pairs = [(flat[places[i][0]:places[i][0] + places[i][1]],
                  torch.empty(0, dtype=torch.uint8, device=parts.storages[i].device).set_(parts.storages[i]))
                 for i in which if places[i][1]]
        if pairs:  # one call for all (torch groups them by device)
            torch._foreach_copy_([into for into, _ in pairs], [source for _, source in pairs])

    if after is None:
        copy_all()
        return
    event, device = after
    stream = torch.cuda.Stream(device=device)
    with torch.cuda.stream(stream):
        stream.wait_event(event)
        copy_all()
    stream.synchronize()


def _cuda_event(parts: Split, which: Sequence[int]) -> Any:
    """Where the training stream is now, for a copy of CUDA tensors on another stream to wait on."""
    devices = [parts.storages[i].device for i in which if parts.storages[i].device.type == "cuda"]
    if not devices:
        return None
    import torch

    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(devices[0]))
    return event, devices[0]
