"""Logs that outlive the pods: a rank's output, kept under the job's results prefix in S3.

A finished job's pods go with `ttlSecondsAfterFinished`, and a gang restart deletes every rank's
pod, and with them the only copy of what the ranks printed. The keeper puts pipes behind file
descriptors 1 and 2 (so the user's prints, tracebacks, logging, C++ backends' messages and
DataLoader workers' output all pass through it), writes everything on to the original stdout and
stderr unchanged, and keeps a copy that goes to
`<results>/<namespace>/<job>/logs/attempt-<n>/rank-<r>/part-<p>.log` every
$DDP_LOG_UPLOAD_INTERVAL_SECONDS (30) and at exit (normal, error, SIGTERM, hang). A SIGKILL or an
OOM kill loses at most the last interval. Parts hold up to PART_BYTES, so a chatty rank's uploads
stay small: only the part being written is uploaded again.

The same tee hands the output to its listeners: the metric lines a rank prints are recognised there
(printedmetrics.py, unless $DDP_METRICS_FROM_OUTPUT is false), so the tee runs also for a job without
a results prefix, keeping nothing in S3 then.
"""

from __future__ import annotations

import logging
import os
import selectors
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from ddp_contract import envnames, layout

from .. import env
from ..errors import TrainerError
from ..storage import s3
from .heartbeat import Heartbeat

log = logging.getLogger(__name__)

PART_BYTES = 16 * 1024**2
DRAIN_SECONDS = 2.0  # at exit: how long to wait for output still in the pipes (a DataLoader worker's)
# At exit, how long the last upload may take before the rank exits anyway: a rank stopped by a signal
# (a deleted pod) has its grace period; one that ended by itself keeps nobody waiting, and its log
# (its traceback, its last prints) is worth a slow S3 server's while.
FINAL_UPLOAD_SECONDS = 10.0
ENDED_UPLOAD_SECONDS = 120.0
_STREAMS = (1, 2)

Upload = Callable[[int, bytes], None]  # (part number, the part's bytes so far)


class Listener(Protocol):
    """What else reads the rank's output: `feed` must return at once (the rank's writes wait on it)."""

    def feed(self, data: bytes, stream: int = 1) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


class Parts:
    """The kept output, cut into parts of at most `part_bytes`; which parts changed since uploaded."""

    def __init__(self, part_bytes: int = PART_BYTES) -> None:
        self.part_bytes = part_bytes
        self._parts: dict[int, bytearray] = {0: bytearray()}
        self._current = 0
        self._dirty: set[int] = set()
        self._lock = threading.Lock()

    def add(self, data: bytes) -> None:
        with self._lock:
            while data:
                room = self.part_bytes - len(self._parts[self._current])
                if room <= 0:
                    self._current += 1
                    self._parts[self._current] = bytearray()
                    continue
                self._parts[self._current] += data[:room]
                self._dirty.add(self._current)
                data = data[room:]

    def changed(self) -> list[tuple[int, bytes]]:
        """The parts written since the last call, and forgets full ones (they will not change again)."""
        with self._lock:
            out = [(part, bytes(self._parts[part])) for part in sorted(self._dirty)]
            self._dirty.clear()
            for part, _ in out:
                if part != self._current:
                    del self._parts[part]
            return out

    def unsent(self, parts: list[tuple[int, bytes]]) -> None:
        """An upload failed: these parts are to be sent again."""
        with self._lock:
            for part, data in parts:
                if part not in self._parts:
                    self._parts[part] = bytearray(data)
                self._dirty.add(part)


class LogKeeper:
    """Tees fds 1 and 2 (`start`), or a child's output pipes (`attach`), into `Parts`, uploaded every
    `interval_s` (0: only at `finish`; upload None: nothing kept), and into each listener, flushed on
    the same interval and closed at `finish`."""

    def __init__(self, upload: Upload | None, interval_s: float, part_bytes: int = PART_BYTES,
                 listeners: Sequence[Listener] = ()) -> None:
        self.upload = upload
        self.listeners = list(listeners)
        self.interval_s = interval_s
        self.parts = Parts(part_bytes)
        self._originals: dict[int, int] = {}  # pipe read end -> a copy of the original fd it writes on to
        self._saved: dict[int, int] = {}  # fd 1 or 2 -> its copy of the original
        self._attached: list[int] = []  # a child's pipe read ends, closed at finish
        self._streams: dict[int, int] = {}  # pipe read end -> the stream it carries (1 or 2)
        self._stop = threading.Event()
        self._closing = threading.Event()
        self._finisher: int | None = None  # the thread that runs finish()
        self._finish_lock = threading.Lock()
        self._done = threading.Event()
        self._warned = False
        # One upload at a time: the last one (at finish) waits for the interval's in flight, which would
        # otherwise land after it and leave an older copy of the part in S3.
        self._upload_lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name="ddp-log-tee", daemon=True)
        self._uploader = threading.Thread(target=self._upload_every_interval, name="ddp-log-upload", daemon=True)

    def start(self) -> LogKeeper:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd in _STREAMS:
            read_end, write_end = os.pipe()
            self._saved[fd] = os.dup(fd)
            self._originals[read_end] = self._saved[fd]
            self._streams[read_end] = fd
            os.dup2(write_end, fd)
            os.close(write_end)
        return self._run()

    def attach(self, outputs: Sequence[tuple[int, int]]) -> LogKeeper:
        """Tee the read ends of a child's output pipes, each on to its fd (the child's stdout to 1, its
        stderr to 2): this process's own output is left as it is."""
        for read_end, out in outputs:
            self._originals[read_end] = self._streams[read_end] = out
            self._attached.append(read_end)
        return self._run()

    def _run(self) -> LogKeeper:
        self._reader.start()
        if self.interval_s > 0:
            self._uploader.start()
        return self

    def _read(self) -> None:
        try:
            self._tee()
        except BaseException:
            # Fail open: with nobody reading the pipes, the rank would block on its next print.
            self._restore()
            log.exception("the rank's log is no longer kept in S3")
            raise

    def _restore(self) -> None:
        for fd, original in self._saved.items():
            os.dup2(original, fd)  # closes this process's write end of the pipe

    def _tee(self) -> None:
        selector = selectors.DefaultSelector()
        for read_end in self._originals:
            selector.register(read_end, selectors.EVENT_READ)
        open_ends = len(self._originals)
        drain_until: float | None = None
        while open_ends:
            if self._closing.is_set() and drain_until is None:
                drain_until = time.monotonic() + DRAIN_SECONDS
            ready = selector.select(timeout=0.2)
            if not ready and drain_until is not None:
                break  # closing, and nothing more came for a while
            for key, _ in ready:
                data = os.read(key.fd, 65536)
                if not data:  # every writer closed it
                    selector.unregister(key.fd)
                    open_ends -= 1
                    continue
                _write_all(self._originals[key.fd], data)
                if self.upload is not None:
                    self.parts.add(data)
                self._feed(data, self._streams[key.fd])
            if drain_until is not None and time.monotonic() > drain_until:
                break
        selector.close()

    def _feed(self, data: bytes, stream: int) -> None:
        for listener in list(self.listeners):
            try:
                listener.feed(data, stream)
            except Exception:
                self.listeners.remove(listener)
                log.exception("%s no longer reads this rank's output", type(listener).__name__)

    def _upload_every_interval(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.upload_changed()
            self._each_listener("flush")

    def _each_listener(self, call: str) -> None:
        for listener in list(self.listeners):
            try:
                getattr(listener, call)()
            except Exception as error:  # noqa: BLE001 - as in _feed
                log.warning("%s.%s failed: %s", type(listener).__name__, call, error)

    def upload_changed(self) -> None:
        if self.upload is None:
            return
        with self._upload_lock:
            changed = self.parts.changed()
            try:
                for part, data in changed:
                    self.upload(part, data)
            except (TrainerError, OSError) as error:
                self.parts.unsent(changed)
                if not self._warned:
                    self._warned = True
                    log.warning("keeping this rank's log in S3 failed (retried every interval): %s", error)

    def finish(self, upload_s: float = FINAL_UPLOAD_SECONDS) -> None:
        """Put the original fds back, take in what is still in the pipes, upload the rest (waiting up
        to `upload_s` for it). Once."""
        with self._finish_lock:
            first = self._finisher is None
            if first:
                self._finisher = threading.get_ident()
        if not first:
            # Another thread (the hang watchdog's, say) waits for the first caller's upload to end;
            # the first caller's own thread (in a signal handler) must not wait for itself.
            if self._finisher != threading.get_ident():
                self._done.wait(DRAIN_SECONDS + 1 + upload_s)
            return
        try:
            self._finish(upload_s)
        finally:
            self._done.set()

    def _finish(self, upload_s: float) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        self._stop.set()
        self._restore()
        self._closing.set()
        if self._reader.is_alive() and self._reader is not threading.current_thread():
            self._reader.join(DRAIN_SECONDS + 1)
        if not self._reader.is_alive():
            for read_end in self._attached:
                os.close(read_end)
            self._attached = []
        last = threading.Thread(target=self._last, name="ddp-log-last-upload", daemon=True)
        last.start()
        if self._warned:  # S3 already failed this rank: no longer wait on it than a stopped rank would
            upload_s = min(upload_s, FINAL_UPLOAD_SECONDS)
        last.join(upload_s)
        if last.is_alive() and self.upload is not None:
            log.warning("the end of this rank's log may not be kept in S3: its upload took over %.0f s", upload_s)

    def _last(self) -> None:
        self.upload_changed()
        self._each_listener("close")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except OSError:  # the original stream is gone (a closed terminal): the copy still goes to S3
            return
        view = view[written:]


def s3_upload(prefix: s3.S3Url, attempt: int, rank: int) -> Upload:
    def upload(part: int, data: bytes) -> None:
        s3.put_bytes(prefix.join(layout.log_part(attempt, rank, part)), data, content_type="text/plain; charset=utf-8")

    return upload


_keeper: LogKeeper | None = None


def start(rank: int, environ: dict[str, str] | None = None) -> LogKeeper | None:
    """Start the tee on this rank's output: kept in S3 where the job has a results prefix, and read
    for metric lines unless $DDP_METRICS_FROM_OUTPUT says not to; None where neither is wanted."""
    global _keeper
    environ = dict(os.environ) if environ is None else environ
    if _keeper is not None:
        return _keeper
    keeper = make_keeper(rank, environ)
    _keeper = keeper.start() if keeper is not None else None
    return _keeper


def make_keeper(rank: int, environ: Mapping[str, str], extra: Sequence[Listener] = (),
                progress: Heartbeat | None = None) -> LogKeeper | None:
    """A LogKeeper, not started, for `rank`'s output in the attempt `environ` names: its parts go to
    S3 where the job has a results prefix, and metric lines feed rank 0's progress and every rank's
    metrics (printedmetrics.py) unless $DDP_METRICS_FROM_OUTPUT says not to (and tick `progress`, a
    command's hang watch clock); `extra` listeners read it besides. None where nothing would read it."""
    from ..storage.results import S3ResultsHandler, job_prefix
    from .printedmetrics import PrintedMetrics
    from .progress import default_reporter

    upload: Upload | None = None
    results: S3ResultsHandler | None = None
    try:
        interval = env.log_upload_interval_s(environ)
        scan = env.metrics_from_output(environ)
        if environ.get(envnames.RESULTS_URI, "").strip():
            job = env.JobInfo.from_env(environ)
            prefix = job_prefix(env.results_uri(environ), job)
            upload = s3_upload(prefix, job.attempt, rank)
            if scan:
                results = S3ResultsHandler(prefix, rank=rank, flush_interval_s=float("inf"), by_code=False,
                                           attempt=job.attempt)
    except TrainerError as error:
        log.warning("this rank's output is not kept in S3 nor read for metrics: %s", error)
        return None
    if upload is None and not scan and not extra:
        return None
    reporter = default_reporter(rank, by_code=False) if scan and rank == 0 else None
    listeners = [*([PrintedMetrics(reporter, results, progress)] if scan else []), *extra]
    return LogKeeper(upload, interval, listeners=listeners)


def finish(upload_s: float = FINAL_UPLOAD_SECONDS) -> None:
    """Upload what this rank printed, at its exit; a no-op where nothing is kept."""
    if _keeper is not None:
        _keeper.finish(upload_s)
