"""Training progress for the DDPJob status, reported by rank 0 at a bounded rate.

Rank 0 writes the latest progress as one JSON object to $DDP_PROGRESS_FILE (atomically), prints
one structured log line and, when it runs under the operator with the `kubernetes` package
installed, patches the DDPJob's status.progress (jobstatus.py). A failing sink is logged and
skipped; progress never stops training.
Record: {"epoch", "step", "loss", "samplesPerSecond", "stepSeconds", "percent", "remainingSeconds",
"remaining" (the same, as 1h02m), "updatedAt" (RFC 3339, UTC)}; how far the run is comes from the
reporter's total steps, or from a progress bar (printedmetrics.py).

The time left extrapolates a pace, which the first steps say little about: the first report comes
after one-time costs (CUDA context, autotuning, compilation, DataLoader workers starting), and a few
steps' pace is one step's jitter. So a record says it only once the run has been watched for at least
MIN_PACE_STEPS steps and MIN_PACE_SECONDS seconds since the first report that said how far it was
(where the reports say no step, MIN_PACE_PERCENT of the run instead of the steps). A run that ended as
it should (`finish()`) is complete: its last record says 100% where how far it was is known, and no
time left.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO, Any

from ddp_contract.metriclines import PROGRESS_EVENT
from ddp_contract.timestamps import rfc3339

from .. import env
from ..storage.urls import atomic_path
from ..values import to_number
from .heartbeat import HEARTBEAT

Sink = Callable[[dict[str, Any]], None]

log = logging.getLogger(__name__)

LOG_EVENT = PROGRESS_EVENT
# How much of the run the pace behind a time left must rest on (see the module docstring): 10 steps put
# one step's jitter at a tenth of the pace at most, and 10 s is one record interval at the default rate.
MIN_PACE_STEPS = 10
MIN_PACE_SECONDS = 10.0
MIN_PACE_PERCENT = 1.0
# Set once the training code reports progress itself: what the rank prints (printedmetrics.py) then
# no longer drives the job's status, so the two never alternate.
_REPORTED_BY_CODE = threading.Event()


def reported_by_code() -> bool:
    return _REPORTED_BY_CODE.is_set()


class FileSink:
    """Replace `path` with the record; readers never see a half-written file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, record: dict[str, Any]) -> None:
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        with atomic_path(self.path) as tmp, open(tmp, "w") as f:
            json.dump(record, f)


class LogSink:
    """One JSON line per report: {"event": "ddp-progress", ...}."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream

    def __call__(self, record: dict[str, Any]) -> None:
        stream = self.stream or sys.stdout
        stream.write(json.dumps({"event": LOG_EVENT, **record}) + "\n")
        stream.flush()


def fanout(sinks: Sequence[Sink]) -> Sink:
    """Send each record to every sink; one sink failing does not stop the others or training."""
    failed: set[int] = set()

    def emit(record: dict[str, Any]) -> None:
        for i, sink in enumerate(sinks):
            try:
                sink(record)
            except Exception as exc:  # noqa: BLE001 - progress is best effort
                if i not in failed:  # warn once per sink, not once per report
                    failed.add(i)
                    log.warning("progress sink %r failed (further failures not logged): %s", sink, exc)

    return emit


class ProgressReporter:
    """`report()` every step; the sink sees at most one record per `min_interval_s`.

    samplesPerSecond is measured over the samples reported since the previous emitted record, and stepSeconds
    (mean wall-clock seconds per step) over the reports since then.
    `flush()` emits the latest state regardless of the rate limit; `finish()` emits it as the run's
    last, complete. When the user's function ends, the runtime finishes every reporter
    `default_reporter()` made where it returned, and flushes them where it failed.
    Thread-safe: the runtime flushes and finishes from threads other than the reporting one.
    """

    def __init__(
        self,
        sink: Sink,
        min_interval_s: float = env.DEFAULT_PROGRESS_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        wallclock: Callable[[], float] = time.time,
        by_code: bool = True,
        total_steps: int | None = None,
    ) -> None:
        """by_code: the training code's reporter (its reports are heartbeats, and mark progress as the
        code's own); False for the one printed metric lines feed. total_steps: the steps the run takes,
        from which each record says the percent done and the time left at the pace since the last."""
        if min_interval_s < 0:
            raise ValueError(f"min_interval_s={min_interval_s} must be >= 0")
        self.sink = sink
        self.min_interval_s = min_interval_s
        self._clock = clock
        self._wallclock = wallclock
        self._last_emit: float | None = None
        self._window_start = clock()
        self._window_first_step: int | None = None  # the step of the last emitted record
        self._window_samples = 0
        self._window_steps = 0
        self._latest: dict[str, Any] | None = None
        self._latest_emitted = True
        self.by_code = by_code
        self.total_steps = total_steps
        self.finished = False  # the run ended as it should: every record from now on is complete
        self._rate_known = True  # whether the reports say how many samples they processed
        # (when, step, percent) of the first report that said how far the run is: where the pace behind
        # the time left is measured from.
        self._pace_start: tuple[float, int | None, float | None] | None = None
        self._last_record: dict[str, Any] | None = None
        self._lock = threading.Lock()

    def report(self, epoch: float | None, step: int | None, loss: float | None = None, samples: int | None = 0,
               *, percent: float | None = None, remaining_s: float | None = None) -> bool:
        """Record progress; `samples` is how many samples this step processed (all ranks; None: not
        known, and no samplesPerSecond is said). An epoch is shown whole (0.5: epoch 0). `percent` and
        `remaining_s` say how far the run is where the reporter has no total_steps to work them out.

        Returns True when a record was emitted. Every rank's report by the training code is its
        heartbeat (hangwatch.py)."""
        if self.by_code:
            _REPORTED_BY_CODE.set()
            if step is not None:
                HEARTBEAT.beat(step)
        with self._lock:
            now = self._clock()
            self._rate_known = samples is not None
            self._window_samples += samples or 0
            self._window_steps += 1
            self._latest = {"epoch": None if epoch is None else math.floor(epoch),
                            "step": None if step is None else int(step), "loss": _float(loss), "percent": percent,
                            "remainingSeconds": remaining_s}
            self._latest_emitted = False
            self._watch_pace(now, self._latest)
            if self._last_emit is not None and now - self._last_emit < self.min_interval_s:
                return False
            self._emit(now)
            return True

    def flush(self) -> bool:
        with self._lock:
            if self._latest is None or self._latest_emitted:
                return False
            self._emit(self._clock())
            return True

    def finish(self) -> bool:
        """The run ended as it should: its latest state goes out as its last record, complete (100%
        where how far it was is known, no time left), though it went out already. Reports after this
        (output read late) go out complete too. False where there is nothing to say, or it was said."""
        with self._lock:
            if self._latest is None or (self.finished and self._latest_emitted):
                return False
            self.finished = True
            if self._latest_emitted and self._last_record is not None:  # no report since: the pace as it was
                record = {**self._last_record, **self._complete(self._last_record),
                          "updatedAt": rfc3339(self._wallclock(), millis=True)}
                self._last_record = record
                self.sink(record)
            else:
                self._emit(self._clock())
            return True

    def _watch_pace(self, now: float, latest: dict[str, Any]) -> None:
        """Start measuring the pace at the first report that says how far the run is, and again where the
        step went back (a run resumed from an earlier checkpoint in the same process)."""
        step, percent = latest["step"], self._percent(latest)
        if percent is None:
            return
        start = self._pace_start
        if start is None or (step is not None and start[1] is not None and step < start[1]):
            self._pace_start = (now, step, percent)

    def _pace_known(self, now: float, step: int | None, percent: float | None) -> bool:
        """Whether the pace since the pace's start rests on enough of the run to say a time left."""
        if self._pace_start is None:
            return False
        since, first_step, first_percent = self._pace_start
        if now - since < MIN_PACE_SECONDS:
            return False
        if step is not None and first_step is not None:
            return step - first_step >= MIN_PACE_STEPS
        return percent is not None and first_percent is not None and percent - first_percent >= MIN_PACE_PERCENT

    def _emit(self, now: float) -> None:
        assert self._latest is not None
        elapsed = now - self._window_start
        rate = self._window_samples / elapsed if elapsed > 0 else 0.0
        steps = self._window_steps
        step = self._latest.get("step")
        if step is not None and self._window_first_step is not None and step > self._window_first_step:
            steps = step - self._window_first_step  # reports need not come every step (printed lines, bars)
        step_seconds = round(elapsed / steps, 6) if steps else None
        record = {**self._latest, "samplesPerSecond": round(rate, 3) if self._rate_known else None,
                  "stepSeconds": step_seconds,
                  **self._how_far(now, self._latest, step_seconds),
                  "updatedAt": rfc3339(self._wallclock(), millis=True)}
        self._last_emit = now
        self._window_start = now
        self._window_first_step = step
        self._window_samples = 0
        self._window_steps = 0
        self._latest_emitted = True
        self._last_record = record
        self.sink(record)

    def _percent(self, latest: dict[str, Any]) -> float | None:
        percent, step = latest.get("percent"), latest.get("step")
        if percent is None and self.total_steps and step is not None:
            percent = 100 * min(step, self.total_steps) / self.total_steps
        return percent if percent is None or math.isfinite(percent) else None

    def _how_far(self, now: float, latest: dict[str, Any], step_seconds: float | None) -> dict[str, Any]:
        step, percent = latest.get("step"), self._percent(latest)
        remaining = latest.get("remainingSeconds")
        if latest.get("percent") is None and self.total_steps and step is not None and step_seconds is not None:
            remaining = max(0, self.total_steps - step) * step_seconds
        if self.finished:
            return self._complete({"percent": percent})
        if not self._pace_known(now, step, percent):
            remaining = None
        return how_far(percent, remaining)

    @staticmethod
    def _complete(record: dict[str, Any]) -> dict[str, Any]:
        """How far a run that ended as it should is: all of it where how far it was is known."""
        return how_far(100.0, 0.0) if record.get("percent") is not None else how_far(None, None)


def how_far(percent: float | None, remaining_s: float | None) -> dict[str, Any]:
    """The record's percent (one decimal) and time left (whole seconds, and as 1h02m)."""
    seconds = None if remaining_s is None or not math.isfinite(remaining_s) else max(0, round(remaining_s))
    return {"percent": None if percent is None or not math.isfinite(percent) else round(min(max(percent, 0.0), 100.0), 1),
            "remainingSeconds": seconds, "remaining": None if seconds is None else duration(seconds)}


def duration(seconds: int) -> str:
    """Seconds as kubectl shows ages: 45s, 12m30s, 1h02m, 3d04h."""
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def _float(value: Any) -> float | None:
    """The loss as `kubectl get ddpjobs` shows it: 4 significant digits (the metrics keep them all);
    None for NaN or infinity, which a JSON status cannot hold."""
    if value is None:
        return None
    value = float(to_number(value))
    return float(f"{value:.4g}") if math.isfinite(value) else None


_made: list[ProgressReporter] = []  # held here: the user's own reference ends with their function


def flush_reporters(succeeded: bool = False) -> None:
    """The runtime's last act for the user's function: each reporter default_reporter() made emits what
    it holds back, as the run's last, complete record where the function returned (`succeeded`). The
    reporter of printed lines says nothing where the code reported itself."""
    for reporter in list(_made):
        if not reporter.by_code and reported_by_code():
            continue
        try:
            if succeeded:
                reporter.finish()
            else:
                reporter.flush()
        except Exception as exc:  # noqa: BLE001 - progress is best effort, as its sinks are
            log.warning("flushing progress failed: %s", exc)


def default_reporter(rank: int | None = None, by_code: bool = True, total_steps: int | None = None) -> ProgressReporter:
    """Rank 0: file ($DDP_PROGRESS_FILE), log line and, under the operator, the DDPJob's status,
    every $DDP_PROGRESS_INTERVAL_SECONDS; with `total_steps` (the run's), the percent done and the time
    left too.

    Other ranks get a reporter whose sink does nothing, so training code need not branch.
    by_code False: the reporter printed metric lines feed, which prints no log line of its own (the
    rank's output already holds the line it reports).
    """
    rank = env.rank() if rank is None else rank
    interval = env.progress_interval_s()
    if rank != 0:
        return ProgressReporter(lambda record: None, interval, by_code=by_code, total_steps=total_steps)
    from ..jobstatus import in_cluster_sink

    sinks: list[Sink] = [FileSink(env.progress_file()), *([LogSink()] if by_code else [])]
    try:
        job_status = in_cluster_sink()
    except ImportError as exc:  # the image may not ship the kubernetes client
        log.warning("progress goes to %s and the log only: %s", env.progress_file(), exc)
        job_status = None
    except Exception as exc:  # noqa: BLE001 - e.g. no service-account token mounted
        log.warning("cannot write progress to the DDPJob status: %s", exc)
        job_status = None
    if job_status is not None:
        sinks.append(job_status)
    reporter = ProgressReporter(fanout(sinks), interval, by_code=by_code, total_steps=total_steps)
    _made.append(reporter)
    return reporter
