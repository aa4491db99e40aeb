"""What the metric lines a rank prints feed (ddp_contract.metriclines): rank 0's progress in the job's
status (`kubectl get ddpjobs`), and every rank's metrics under the job's results prefix (`metrics()`,
`plot()`), as the progress reporter and `log_metrics` would, until the training code calls those
itself: its own reports win, so the two never alternate or double.

The output tee (logkeeper.py) hands every chunk of output to `feed` on its reader thread, which
must never wait; the lines recognised in each chunk queue together (at most MAX_QUEUED chunks) for a
thread of their own, which writes the job's status and keeps the records, flushed to S3 by the tee's
upload interval and at exit.

A line without a step (Hugging Face's Trainer logs the epoch) is reported without one, and its
metrics record's step is the line's number among this rank's metric lines.
"""

from __future__ import annotations

import logging
import queue
import threading

from ddp_contract.metriclines import EPOCH_KEYS, LOSS_KEY, STEP_KEYS, LineScanner, MetricLine

from ..storage.results import S3ResultsHandler, logged_by_code
from .progress import ProgressReporter, reported_by_code

log = logging.getLogger(__name__)

MAX_QUEUED = 1_000
# Keys a metrics record holds for itself; a printed value of that name is not copied over it.
RECORD_KEYS = frozenset({*STEP_KEYS, *EPOCH_KEYS, LOSS_KEY, "time", "rank", "source"})


class PrintedMetrics:
    def __init__(self, reporter: ProgressReporter | None, results: S3ResultsHandler | None) -> None:
        """reporter: rank 0's (by_code=False), else None; results: where the records go (by_code=False,
        flushed by `flush`), None without a results prefix."""
        self.reporter = reporter
        self.results = results
        self.lines = 0
        self._batch: list[MetricLine] = []
        self._scanner = LineScanner(self._batch.append)
        self._queue: queue.Queue[list[MetricLine] | None] = queue.Queue(MAX_QUEUED)
        self._dropped = 0
        self._worker = threading.Thread(target=self._work, name="ddp-printed-metrics", daemon=True)
        self._worker.start()

    def feed(self, data: bytes) -> None:
        """Output as the rank wrote it (the tee's reader thread): returns at once."""
        self._scanner.feed(data)
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
                for line in batch:
                    self.record(line)
            except Exception as error:  # noqa: BLE001 - never disturb the run for a courtesy
                log.warning("a printed metric line was not recorded: %s", error)
            finally:
                self._queue.task_done()
        self._queue.task_done()

    def record(self, line: MetricLine) -> None:
        """One recognised line into the status and the metrics, where the code does not report its own."""
        self.lines += 1
        if self.reporter is not None and not reported_by_code():
            self.reporter.report(line.epoch, line.step, line.loss, samples=None)
        if self.results is not None and not logged_by_code():
            extra = {k: v for k, v in line.values.items() if k not in RECORD_KEYS}
            step = line.step if line.step is not None else self.lines
            epoch = line.epoch if line.epoch is None or not line.epoch.is_integer() else int(line.epoch)
            self.results.log_metrics(step, epoch, line.loss, **extra)

    def flush(self) -> None:
        """Send what the queue holds on: the last progress into the status, the records to S3."""
        self._queue.join()
        if self.reporter is not None and not reported_by_code():
            self.reporter.flush()
        if self.results is not None:
            self.results.flush()

    def close(self) -> None:
        self.flush()
        self._queue.put(None)
