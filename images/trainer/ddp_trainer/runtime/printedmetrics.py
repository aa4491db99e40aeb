"""What the metric lines and progress bars a rank prints feed (ddp_contract.metriclines): rank 0's
progress in the job's status (`kubectl get ddpjobs`: epoch, step, loss, and from a bar the percent and
the time left, runtime/bars.py), and every rank's metrics under the job's results prefix (`metrics()`,
`plot()`: the metric lines), as the progress reporter and `log_metrics` would, until the training code
calls those itself: its own reports win, so the two never alternate or double. What lines and bars
say is merged: Hugging Face's Trainer logs the loss and epoch in its lines, the step and percent in its
bar.

The output tee (logkeeper.py) hands every chunk of output to `feed` on its reader thread, which
must never wait; the lines recognised in each chunk queue together (at most MAX_QUEUED chunks) for a
thread of their own, which writes the job's status and keeps the records, flushed to S3 by the tee's
upload interval and at exit.

A line without a step (Hugging Face's Trainer logs the epoch) is reported without one, and its
metrics record's step is the line's number among this rank's metric lines.

Where the run ended as it should (`succeeded`), the last progress goes out complete, once the output
and the trainer's messages are all read (progress.py: ProgressReporter.finish).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from ddp_contract.metriclines import (
    EPOCH_KEYS,
    LOSS_KEY,
    PROGRESS_EVENT,
    STEP_KEYS,
    LineScanner,
    MetricLine,
    ProgressBar,
)

from ..storage.results import S3ResultsHandler, logged_by_code
from .bars import BarProgress, BarTracker
from .heartbeat import HEARTBEAT, Heartbeat
from .progress import ProgressReporter, reported_by_code

log = logging.getLogger(__name__)

MAX_QUEUED = 1_000
PROGRESS_MARK = f'"{PROGRESS_EVENT}"'.encode()
# Keys a metrics record holds for itself; a printed value of that name is not copied over it.
RECORD_KEYS = frozenset({*STEP_KEYS, *EPOCH_KEYS, LOSS_KEY, "time", "rank", "source"})


class Probed(NamedTuple):
    """What the in-process hook read off rank 0's Hugging Face or Lightning trainer (inprocess.py)."""

    step: int | None
    total: float | None
    epoch: float | None
    loss: float | None

    @classmethod
    def of(cls, record: Mapping[str, Any]) -> Probed:
        def number(key: str) -> float | None:
            value = record.get(key)
            return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

        step = number("step")
        return cls(None if step is None else int(step), number("total"), number("epoch"), number("loss"))


class PrintedMetrics:
    def __init__(self, reporter: ProgressReporter | None, results: S3ResultsHandler | None,
                 progress: Heartbeat | None = None) -> None:
        """reporter: rank 0's (by_code=False), else None; results: where the records go (by_code=False,
        flushed by `flush`), None without a results prefix; progress: the output of a command the runtime
        runs, whose code beats no heartbeat itself: each line or bar ticks `progress` (its hang watch's
        clock), and a line's step is the rank's step (HEARTBEAT, which its failure line says)."""
        self.reporter = reporter
        self.results = results
        self.progress = progress
        # The output holds the reporter's own progress line: the code reports progress itself (in a
        # process of its own, which reported_by_code() cannot see).
        self.code_reports = False
        self.lines = 0
        self.bars = BarTracker()
        self.state = BarProgress()  # the job's progress as the lines and bars said it so far
        self.probed = False  # the code's trainer says how far it is: its bars no longer do
        self._pace: tuple[float, int] | None = None  # (when, step) of the first probe, for the time left
        self._succeeded = False
        self._batch: list[MetricLine | ProgressBar | Probed] = []
        self._scanners: dict[int, LineScanner] = {}  # by stream: stdout's and stderr's lines interleave
        self._queue: queue.Queue[list[MetricLine | ProgressBar | Probed] | None] = queue.Queue(MAX_QUEUED)
        self._dropped = 0
        self._worker = threading.Thread(target=self._work, name="ddp-printed-metrics", daemon=True)
        self._worker.start()

    @staticmethod
    def among(listeners: Iterable[object]) -> PrintedMetrics | None:
        """The PrintedMetrics among a tee's listeners, None where its output is not read for progress."""
        return next((x for x in listeners if isinstance(x, PrintedMetrics)), None)

    def feed(self, data: bytes, stream: int = 1) -> None:
        """Output as the rank wrote it (the tee's reader thread): returns at once."""
        if PROGRESS_MARK in data:
            self.code_reports = True
        scanner = self._scanners.get(stream)
        if scanner is None:
            scanner = self._scanners[stream] = LineScanner(self._batch.append, self._batch.append)
        scanner.feed(data)
        if not self._batch:
            return
        batch = self._batch.copy()
        self._batch.clear()
        try:
            self._queue.put_nowait(batch)
        except queue.Full:
            self._dropped += len(batch)
            if self._dropped == len(batch):
                log.warning("printed metric lines come faster than they are recorded: some are dropped")

    def _work(self) -> None:
        while (batch := self._queue.get()) is not None:
            try:
                for item in batch:
                    if isinstance(item, ProgressBar):
                        self.record_bar(item)
                    elif isinstance(item, Probed):
                        self.record_probe(item)
                    else:
                        self.record(item)
            except Exception as error:  # noqa: BLE001 - never disturb the run for a courtesy
                log.warning("a printed metric line was not recorded: %s", error)
            finally:
                self._queue.task_done()
        self._queue.task_done()

    def record(self, line: MetricLine) -> None:
        """One recognised line into the status and the metrics, where the code does not report its own."""
        self.lines += 1
        self._tick(line.step)
        if self.code_reports:
            return
        state = self.state
        self._report(BarProgress(state.epoch if line.epoch is None else int(line.epoch),
                                 state.step if line.step is None else line.step, line.loss, state.percent,
                                 state.remaining_s))
        if self.results is not None and not logged_by_code():
            extra = {k: v for k, v in line.values.items() if k not in RECORD_KEYS}
            step = line.step if line.step is not None else self.lines
            record_epoch = line.epoch if line.epoch is None or not line.epoch.is_integer() else int(line.epoch)
            self.results.log_metrics(step, record_epoch, line.loss, **extra)

    def probe(self, record: Mapping[str, Any], wait_s: float = 0.0) -> None:
        """A message of the in-process hook (any thread): queued as the lines are, waiting up to `wait_s`
        for room (dropped then)."""
        batch: list[MetricLine | ProgressBar | Probed] = [Probed.of(record)]
        try:
            if wait_s > 0:
                self._queue.put(batch, timeout=wait_s)
            else:
                self._queue.put_nowait(batch)
        except queue.Full:
            pass

    def record_probe(self, said: Probed, now: float | None = None) -> None:
        """How far the code's trainer says it is: the step of how many, the epoch, the loss; it wins
        over the bars, which say less (an epoch bar does not know how many epochs there are)."""
        self.probed = True
        self._tick(said.step)
        if self.code_reports:
            return
        percent = remaining = None
        if said.step is not None and said.total:
            percent = 100 * said.step / said.total
            now = time.monotonic() if now is None else now
            if self._pace is None:
                self._pace = (now, said.step)
            since, first = self._pace
            if said.step > first:
                remaining = (said.total - said.step) * (now - since) / (said.step - first)
        self._report(self._merged(BarProgress(None if said.epoch is None else int(said.epoch), said.step, said.loss,
                                              percent, remaining)))

    def record_bar(self, bar: ProgressBar) -> None:
        """One drawing of a progress bar into the status: the job's bar's step, percent and time left."""
        said = self.bars.update(bar)
        self._tick(None)
        if said is None or self.code_reports or self.probed:
            return
        self._report(self._merged(said))

    def _tick(self, step: int | None) -> None:
        """A command's progress moved (its hang watch's clock), to `step` where it says one."""
        if self.progress is not None:
            self.progress.tick()
            if step is not None:
                HEARTBEAT.beat(step)

    def _merged(self, said: BarProgress) -> BarProgress:
        """What a bar or a probe says, its epoch, step and loss kept from before where it says none."""
        state = self.state
        return BarProgress(state.epoch if said.epoch is None else said.epoch, state.step if said.step is None else said.step,
                           state.loss if said.loss is None else said.loss, said.percent, said.remaining_s)

    def _report(self, state: BarProgress) -> None:
        self.state = state
        if self.reporter is not None and not reported_by_code():
            self.reporter.report(state.epoch, state.step, state.loss, samples=None, percent=state.percent,
                                 remaining_s=state.remaining_s)

    def succeeded(self) -> None:
        """The rank's code ended as it should: its last progress (`flush`, at `close`) is complete."""
        self._succeeded = True

    def flush(self) -> None:
        """Send what the queue holds on: the last progress into the status, the records to S3."""
        self._queue.join()
        if self.reporter is not None and not reported_by_code() and not self.code_reports:
            if self._succeeded:
                self.reporter.finish()
            else:
                self.reporter.flush()
        if self.results is not None:
            self.results.flush()

    def close(self) -> None:
        self.flush()
        self._queue.put(None)
