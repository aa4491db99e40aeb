"""Results and per-rank metrics under the job's S3 results prefix.

Layout (``<results>`` is $DDP_RESULTS_URI, e.g. ``s3://bucket/runs``)::

    <results>/<namespace>/<job name>/results/<name>                   submit_result()
    <results>/<namespace>/<job name>/metrics/rank-<RRRRR>-<session>-<ppppp>.jsonl   log_metrics()
    <results>/<namespace>/<job name>/checkpoints/...                  checkpoint.py

The job prefix survives gang restarts (same name), which is what lets a restarted job resume.
S3 cannot append, so each rank buffers its metrics and rewrites its own JSON-lines object at
most every `flush_interval_s`; once that object holds PART_BYTES the next lines start a new part
(`ppppp`), so a long job neither holds all its metrics in memory nor uploads them again and again.
The parts are written on a thread (storage/committer.py), so a step that logs never waits for S3; while
S3 cannot be reached they wait in memory and go up once it answers.
`session` (start time + pid) keeps a restarted rank from overwriting the lines its previous
incarnation wrote.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

from ddp_contract import envnames, layout

from .. import env
from ..errors import ConfigError, TrainerError
from ..values import to_number
from . import s3
from .committer import Committer

log = logging.getLogger(__name__)

PART_BYTES = 4 * 1024 * 1024  # a metrics object this large is left as it is; later lines go to the next part


def job_prefix(results_uri: str | None = None, job: env.JobInfo | None = None) -> s3.S3Url:
    """`s3://bucket/prefix/<namespace>/<job name>` for this job."""
    base = s3.parse_uri(results_uri or env.results_uri())
    job = job or env.JobInfo.from_env()
    return base.join(job.namespace, job.require_name())


def keep_attempt_cause(attempt: int, cause: dict[str, Any]) -> None:
    """Why `attempt` began (status.attemptCause), under the job's results for when its Events and the job
    are gone; nothing without a results prefix. A failure is logged: the dashboard's mark then says less."""
    _keep_restart_record(layout.attempt_cause(attempt), cause, f"why attempt {attempt} began")


def keep_recovery(attempt: int, recovery: dict[str, Any]) -> None:
    """Where `attempt` resumed from (status.recovery), beside why it began."""
    _keep_restart_record(layout.attempt_recovery(attempt), recovery, f"where attempt {attempt} resumed from")


def _keep_restart_record(key: str, record: dict[str, Any], what: str) -> None:
    if not os.environ.get(envnames.RESULTS_URI, "").strip():
        return
    try:
        s3.put_bytes(job_prefix().join(key), json.dumps(record).encode(), content_type="application/json")
    except (TrainerError, OSError) as error:
        log.warning("%s is not kept in S3: %s", what, error)


def _check_name(name: str) -> str:
    """A result's name is a relative path under the job's results: refused, not rewritten, if it is not."""
    if not layout.is_result_path(name):
        raise ConfigError(f"result name {name!r} must be a relative path (no leading or trailing '/', "
                          "no empty, '.' or '..' parts)")
    return name


# Set once the training code logs metrics itself: from then on the metric lines it prints are not
# logged too (printedmetrics.py), and the client drops what was (by the records' "source").
_LOGGED_BY_CODE = threading.Event()
# Each handler's session is its own (two handlers made in one second by one process would otherwise
# write the same objects).
_HANDLERS = itertools.count()
PRINTED = "printed"  # the "source" of records made from printed metric lines


def logged_by_code() -> bool:
    return _LOGGED_BY_CODE.is_set()


class S3ResultsHandler:
    """`submit_result(name, data)` from any rank; `log_metrics(...)` appends to this rank's JSON lines."""

    def __init__(
        self,
        prefix: s3.S3Url | str | None = None,
        rank: int | None = None,
        flush_interval_s: float = 30.0,
        by_code: bool = True,
        attempt: int | None = None,
    ) -> None:
        """by_code: the training code's handler; False for the one printed metric lines feed, whose
        records say so ("source": "printed"). attempt: the gang attempt its records belong to
        (default $DDP_ATTEMPT), so a reader can tell where a restarted gang took over."""
        if isinstance(prefix, str):
            prefix = s3.parse_uri(prefix)
        self.prefix = prefix or job_prefix()
        self.rank = env.rank() if rank is None else rank
        self.attempt = env.JobInfo.from_env().attempt if attempt is None else attempt
        self.flush_interval_s = flush_interval_s
        self.by_code = by_code
        handler = next(_HANDLERS)
        self.session = f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}" + (f".{handler}" if handler else "")
        self._lines: list[str] = []
        self._bytes = 0
        self._part = 0
        self._dirty = False
        self._last_flush = time.monotonic()
        self._lock = threading.Lock()
        self._commits: Committer[dict[s3.S3Url, bytes], None] = Committer(
            self._put, env.s3_outage_s(), "metrics", describe=lambda parts: f"metrics parts {', '.join(map(str, parts))}",
            merge=lambda older, newer: {**older, **newer})  # a part's newer body replaces it; other parts stay

    @property
    def metrics_url(self) -> s3.S3Url:
        return self.prefix.join(layout.METRICS, f"rank-{self.rank:05d}-{self.session}-{self._part:05d}.jsonl")

    def result_url(self, path: str) -> s3.S3Url:
        return self.prefix.join(layout.RESULTS, _check_name(path))

    def submit_result(self, path: str, data: bytes | str) -> s3.S3Url:
        """Store `data` as `results/<path>`; returns where it went. dask-pytorch-ddp's call as it was:
        `submit_result(path=..., data=...)`; the client's `process_results` downloads them."""
        url = self.result_url(path)
        s3.put_bytes(url, data.encode() if isinstance(data, str) else bytes(data))
        return url

    def log_metrics(
        self,
        step: int,
        epoch: float | None = None,
        loss: float | None = None,
        **extra: Any,
    ) -> None:
        if self.by_code:
            _LOGGED_BY_CODE.set()
        record: dict[str, Any] = {"step": int(step), "epoch": epoch, "loss": to_number(loss), "time": time.time()}
        record["rank"] = self.rank
        record["attempt"] = self.attempt
        record.update({k: to_number(v) for k, v in extra.items()})
        if not self.by_code:
            record["source"] = PRINTED
        line = json.dumps(record, default=str)
        with self._lock:
            self._lines.append(line)
            self._bytes += len(line) + 1
            self._dirty = True
            due = time.monotonic() - self._last_flush >= self.flush_interval_s
        if due:
            self._hand()

    def _hand(self) -> None:
        """Hands this rank's lines of its current part to the thread that writes them; a part complete
        (PART_BYTES) goes with them and later lines start the next (raises StorageUnavailableError once S3
        has been out longer than $DDP_S3_OUTAGE_SECONDS)."""
        with self._lock:
            if not self._dirty:
                return
            part = {self.metrics_url: ("\n".join(self._lines) + "\n").encode()}
            self._dirty = False
            self._last_flush = time.monotonic()
            if self._bytes >= PART_BYTES:
                self._lines, self._bytes = [], 0
                self._part += 1
        self._commits.hand(part)

    def flush(self) -> None:
        """Writes this rank's lines, and waits for S3 to hold them (through an outage up to its limit)."""
        self._hand()
        self._commits.wait()

    @staticmethod
    def _put(parts: dict[s3.S3Url, bytes]) -> None:
        for url, body in parts.items():
            s3.put_bytes(url, body, content_type="application/x-ndjson")

    def close(self) -> None:
        self._hand()
        self._commits.close()

    def __enter__(self) -> S3ResultsHandler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DaskResultsHandler(S3ResultsHandler):
    """dask-pytorch-ddp's `DaskResultsHandler(key)` for code ported by its import: the key (a Dask
    pub-sub topic there) is not needed here, where the job's name keeps its results apart, and is
    ignored. The handler is an S3ResultsHandler under the job's prefix."""

    def __init__(self, pub_sub_key: str | None = None, *, rank: int | None = None,
                 flush_interval_s: float = 30.0) -> None:
        super().__init__(None, rank=rank, flush_interval_s=flush_interval_s)
        self.pub_sub_key = pub_sub_key


def read_metrics(prefix: s3.S3Url) -> list[Mapping[str, Any]]:
    """All ranks' metric records under a job prefix (for tests, notebooks and the operator)."""
    records: list[Mapping[str, Any]] = []
    for key, _ in s3.list_objects(prefix.join(layout.METRICS)):
        if key.endswith(".jsonl"):
            body = s3.get_bytes(s3.S3Url(prefix.bucket, key)).decode()
            records.extend(json.loads(line) for line in body.splitlines() if line.strip())
    return records
