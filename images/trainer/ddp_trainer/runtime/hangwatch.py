"""Catching a hung rank: a step that stops advancing (a peer that left a collective, a dead data
loader) would otherwise hold the whole gang until the backend's timeout, or forever.

A watch thread looks at the heartbeat; once the step has not advanced for the hang timeout, the
rank dumps every thread's Python stack (and NCCL's flight recorder where nccl runs) to
`<results>/<namespace>/<job>/hangs/attempt-<n>/rank-<r>.txt`, leaves a termination message saying
where, and exits HUNG. Every rank of a hung gang stalls, so every rank dumps its own stacks: at
half its timeout a stalled rank already saves them (without exiting), because with a derived timeout
its peers judge by their own steps, and one of them may fire, and the gang restart take this rank's
pod, before this rank's own timeout comes.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from ddp_contract import layout
from ddp_contract.failureline import describe_hang

from ..data import awaited
from ..errors import ExitCode
from .heartbeat import Heartbeat
from .process_exit import exit_process
from .rankexit import last_words

log = logging.getLogger(__name__)

# Derived timeout: this many times the slowest step so far, never below the floor.
STEP_FACTOR = 10.0
POLL_SECONDS = 0.5
# A rank that found the gang hung waits this long after its dump before it exits: its peers stalled
# at the same moment and are dumping too, and its exit would break their collective before they do.
LINGER_SECONDS = 3.0
# A rank stalled this fraction of its timeout saves its stacks ahead (once per stalled step).
EARLY_DUMP_FRACTION = 0.5


def hang_timeout(configured: float | None, slowest_step_s: float, floor_s: float) -> float | None:
    """The timeout in force: the configured one (0: never), else max(floor, STEP_FACTOR x slowest step)."""
    if configured is not None:
        return configured if configured > 0 else None
    return max(floor_s, STEP_FACTOR * slowest_step_s)


@dataclass(frozen=True)
class Hang:
    step: int | None
    stalled_s: float
    timeout_s: float

    def describe(self) -> str:
        """describe_hang, and what the rank waits on outside torch if anything (a data worker)."""
        waits = awaited.describe()
        return describe_hang(self.step, self.stalled_s, self.timeout_s) + (f"; {waits}" if waits else "")


class HangWatch:
    """Calls `on_hang` once, from its own thread, when the heartbeat stalls past the timeout, and
    `on_stall` once per stalled step when it has stalled EARLY_DUMP_FRACTION of it."""

    def __init__(self, heartbeat: Heartbeat, configured: float | None, floor_s: float,
                 on_hang: Callable[[Hang], None], poll_s: float = POLL_SECONDS,
                 on_stall: Callable[[Hang], None] | None = None) -> None:
        self.heartbeat = heartbeat
        self.configured = configured
        self.floor_s = floor_s
        self.on_hang = on_hang
        self.on_stall = on_stall
        self.poll_s = poll_s
        self._stop = threading.Event()
        self.fired = threading.Event()
        self._stalled_step: int | None = None  # the step on_stall was called for
        self._thread = threading.Thread(target=self._run, name="ddp-hang-watch", daemon=True)

    def start(self) -> HangWatch:
        if hang_timeout(self.configured, 0.0, self.floor_s) is not None:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def hold_if_fired(self) -> None:
        """Once a hang is declared, its dump and exit code win: a collective that breaks meanwhile
        (a peer exited) must not end this rank with another code first."""
        if self.fired.is_set():
            self._thread.join()

    def check(self, fraction: float = 1.0) -> Hang | None:
        """The hang, if the step has stalled past `fraction` of the timeout now (the clock starts at
        the first step)."""
        stalled = self.heartbeat.stalled_for()
        limit = hang_timeout(self.configured, self.heartbeat.slowest_step_s, self.floor_s)
        if stalled is None or limit is None or stalled < limit * fraction:
            return None
        return Hang(self.heartbeat.step, stalled, limit)

    def poll(self) -> bool:
        """One look: on_stall or on_hang as due; True once the hang is declared."""
        hang = self.check()
        if hang is not None:
            self.fired.set()
            self.on_hang(hang)
            return True
        if self.on_stall is None:
            return False
        stall = self.check(EARLY_DUMP_FRACTION)
        if stall is not None and stall.step != self._stalled_step:
            self._stalled_step = stall.step
            self.on_stall(stall)
        return False

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            if self.poll():
                return


def python_stacks() -> str:
    """Every thread's Python stack, by thread name, then faulthandler's view (which also covers
    threads stuck where the interpreter cannot run Python code)."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        parts.append(f"--- thread {names.get(ident, '?')} ({ident})\n{''.join(traceback.format_stack(frame))}")
    with tempfile.TemporaryFile("w+") as raw:
        faulthandler.dump_traceback(raw, all_threads=True)
        raw.seek(0)
        parts.append(f"--- faulthandler\n{raw.read()}")
    return "\n".join(parts)


def nccl_flight_record() -> bytes | None:
    """NCCL's flight recorder (the last collectives of each communicator), when nccl runs and records."""
    try:
        import torch.distributed as dist

        if not (dist.is_initialized() and dist.get_backend() == "nccl"):
            return None
        from torch._C._distributed_c10d import _dump_nccl_trace  # type: ignore[attr-defined]

        data: bytes = _dump_nccl_trace()
        return data
    except Exception as error:  # noqa: BLE001 - a dump is best effort; the stacks still go out
        log.warning("no NCCL flight record: %s", error)
        return None


# Recorded entries per communicator; the flight recorder is off unless the buffer has a size.
NCCL_TRACE_BUFFER = "TORCH_FR_BUFFER_SIZE"
NCCL_TRACE_ENTRIES = "2000"


def enable_nccl_flight_recorder(environ: dict[str, str] | None = None) -> None:
    """Turn NCCL's flight recorder on before the process group starts, unless the user chose a size."""
    (os.environ if environ is None else environ).setdefault(NCCL_TRACE_BUFFER, NCCL_TRACE_ENTRIES)


def save_dump(rank: int, attempt: int, stacks: str, nccl: bytes | None) -> str:
    """Keep a hung rank's dump under the job's results prefix; returns where it went. Without a
    results prefix (or when S3 fails) the stacks are only in the rank's log, which says so."""
    from ..errors import TrainerError
    from ..storage import s3
    from ..storage.results import job_prefix

    try:
        folder = job_prefix().join(layout.HANGS, f"attempt-{attempt}")
        url = folder.join(f"rank-{rank}.txt")
        s3.put_bytes(url, stacks.encode(), content_type="text/plain")
        if nccl:
            s3.put_bytes(folder.join(f"rank-{rank}.nccl-trace.pkl"), nccl)
        return str(url)
    except (TrainerError, OSError) as error:
        log.warning("hang dump kept in the log only: %s", error)
        return "the rank's log"


def stall_handler(rank: int, attempt: int) -> Callable[[Hang], None]:
    """HangWatch's on_stall for this rank: save the stacks ahead, and go on."""
    def dump_ahead(stall: Hang) -> None:
        where = save_dump(rank, attempt, python_stacks(), nccl_flight_record())
        log.warning("rank %d: %s: stacks saved ahead to %s", rank, stall.describe(), where)

    return dump_ahead


def hang_handler(rank: int, attempt: int) -> Callable[[Hang], None]:
    """HangWatch's on_hang for this rank: the stacks to the log and S3, the failure line, then exit HUNG
    once the peers have had LINGER_SECONDS to dump theirs."""
    def dump_and_exit(hang: Hang) -> None:
        stacks = python_stacks()
        sys.stderr.write(f"ddp-trainer: rank {rank} hung: {hang.describe()}; stacks:\n{stacks}\n")
        where = save_dump(rank, attempt, stacks, nccl_flight_record())
        last_words(ExitCode.HUNG, rank, f"{hang.describe()}; stacks in {where}")
        time.sleep(LINGER_SECONDS)
        exit_process(ExitCode.HUNG)

    return dump_and_exit
