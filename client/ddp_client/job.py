"""A handle on one DDPJob: wait for it, read its logs, results and metrics, plot them, delete it."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO, Any, overload

from ddp_contract import api, envnames, labels, layout
from ddp_contract.jobspec import CABundle, S3Spec
from ddp_contract.jobstatus import PHASE_FAILED, PHASE_PENDING, STATUS_PHASE

from . import logs as logtext
from . import logsources, summary
from . import metricrecords as metricdata
from .progressline import ProgressDisplay
from .store import CA_BUNDLES, ResultsPrefix, S3Access, StoreError, ca_bundle_file, job_access

POLL_SECONDS = 2.0
WATCH_SECONDS = 30  # a watch is renewed this often (and at wait()'s deadline)
RECONNECT_SECONDS = 120.0  # how long wait() tries to reach the API server again after a watch's connection broke


# dask-pytorch-ddp's result files are one small object a step: read this many at once.
RESULT_FILE_READERS = 16
# A long run's metrics are parts of about 4 MB each (the runtime's results.PART_BYTES), read side by side.
METRIC_PART_READERS = 4


class JobDeleted(LookupError):
    """The job was deleted before it finished (its S3 results, metrics and logs stay)."""


class JobFailed(RuntimeError):
    """The job ended Failed; the message says why and shows the failed rank's last output."""

    def __init__(self, text: str, status: dict[str, Any]) -> None:
        super().__init__(text)
        self.status = status


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline


@dataclass(frozen=True)
class ResultFile:
    path: str  # relative to the job's results/, as the rank gave it to submit_result
    size: int


@dataclass(frozen=True)
class KeptFile:
    path: str  # relative to the job's kept/: the folder (spec.keepFolders, without a leading '/'), then the file
    size: int


class Job:
    """One DDPJob, by name, through a Kubernetes API client. S3 settings for its results, logs and
    metrics: `s3_access` where given, else $DDP_S3_ENDPOINT, $DDP_S3_REGION/$AWS_REGION,
    $AWS_ACCESS_KEY_ID and $AWS_SECRET_ACCESS_KEY where set, else the job's own (spec.s3's endpoint
    and region, its credentials Secret read through the API)."""

    def __init__(self, name: str, namespace: str, api_client: Any, s3_access: S3Access | None = None,
                 results_uri: str | None = None, seen: dict[str, Any] | None = None) -> None:
        from kubernetes import client

        self.name = name
        self.namespace = namespace
        self.api_client = api_client
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.s3_access = S3Access.from_env() if s3_access is None else s3_access
        self.results_uri = results_uri  # spec.s3.results, for a job already deleted (ttlSecondsAfterFinished)
        self._store: ResultsPrefix | None = None
        self._seen: dict[str, Any] | None = seen  # the job as last read (or given): what is known once it is deleted
        self._kept: logsources.KeptLogs | None = None  # the log parts kept in S3, as read so far
        self._metric_parts: dict[str, tuple[int, list[metricdata.Record]]] = {}  # metrics read: key -> (size, records)
        self._dask_bodies: dict[str, bytes] = {}  # dask-pytorch-ddp's result files read (written once each)
        self._causes: dict[int, dict[str, Any]] = {}  # why each attempt began, as read from S3 (written once each)
        self._recoveries: dict[int, dict[str, Any]] = {}  # where each attempt resumed from, as read from S3

    def __repr__(self) -> str:
        return f"Job({self.namespace}/{self.name})"

    # --- the job and its pods ------------------------------------------------------------------

    def get(self) -> dict[str, Any]:
        from kubernetes.client.rest import ApiException

        try:
            body: dict[str, Any] = self.custom.get_namespaced_custom_object(
                api.GROUP, api.VERSION, self.namespace, api.PLURAL, self.name)
        except ApiException as error:
            if error.status == 404:
                raise LookupError(f"{api.KIND} {self.namespace}/{self.name} does not exist") from None
            raise
        self._seen = body
        return body

    def status(self) -> dict[str, Any]:
        return dict(self.get().get("status") or {})

    def _last_known(self) -> dict[str, Any]:
        """The job now, else (deleted) as this handle last saw it, else only its results URI if given."""
        try:
            return self.get()
        except LookupError:
            if self._seen is not None:
                return self._seen
            if self.results_uri is None:
                raise
            return {"spec": {"s3": {"results": self.results_uri}}}

    def _status_or_none(self) -> dict[str, Any]:
        """The status, or for a deleted job the last seen (nothing if never seen and its results URI was given)."""
        return dict(self._last_known().get("status") or {})

    def pods(self) -> list[dict[str, Any]]:
        """The ranks' pods (those with a rank label: not its data workers)."""
        selector = f"{labels.LABEL_JOB_NAME}={self.name},{labels.LABEL_RANK}"
        found = self.core.list_namespaced_pod(self.namespace, label_selector=selector)
        pods: list[dict[str, Any]] = self.api_client.sanitize_for_serialization(found.items)
        return pods

    def summary(self) -> str:
        return summary.status_text(self.get(), self.pods())

    def wait(self, timeout: float | None = None, out: IO[str] | None = sys.stderr, raise_on_failure: bool = True,
             poll_s: float = POLL_SECONDS) -> dict[str, Any]:
        """Until the job Succeeded or Failed, a progress line (epoch, step, loss, samples/s) on `out`;
        then the outcome, and on failure the reason and the failed rank's last output (JobFailed).
        Every change of the job is seen (a watch), so a job deleted at once when it finishes
        (ttlSecondsAfterFinished: 0) still ends with its outcome; one deleted before it finished
        raises JobDeleted. A connection broken mid-watch is made again (for RECONNECT_SECONDS)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        display = ProgressDisplay(out)
        status: dict[str, Any] = {}
        for body in self._changes(deadline, poll_s):
            status = dict(body.get("status") or {})
            display.show(summary.progress_line(self.name, status), status)
            if status.get(STATUS_PHASE) in summary.FINISHED:
                break
        else:
            raise TimeoutError(f"{self.name} is still {status.get(STATUS_PHASE) or PHASE_PENDING} after {timeout}s")
        outcome = summary.outcome_text(self.name, status)
        display.end(outcome)
        if raise_on_failure and status.get(STATUS_PHASE) == PHASE_FAILED:
            raise JobFailed(outcome, status)
        return status

    def _changes(self, deadline: float | None, poll_s: float) -> Iterator[dict[str, Any]]:
        """The job now, then each change to it, until `deadline` (then the iteration ends); JobDeleted
        if it goes. A watch from the version read, read again where the API server ends the watch."""
        from kubernetes import watch
        from kubernetes.client.rest import ApiException
        from urllib3.exceptions import HTTPError

        version: str | None = None
        dropped: float | None = None  # when a watch's connection last broke, until the job is read again
        while True:
            if version is None:
                try:
                    body = self.get()
                except (ConnectionError, OSError, HTTPError):
                    # Unreachable at the start: said at once. After a drop (an API server restarting, a
                    # network blip): tried again for a while, as a watch's own reconnects would be.
                    if dropped is None or time.monotonic() - dropped > RECONNECT_SECONDS or _past(deadline):
                        raise
                    time.sleep(poll_s)
                    continue
                dropped = None
                version = str(body["metadata"]["resourceVersion"])
                yield body
            if _past(deadline):
                return
            remaining = WATCH_SECONDS if deadline is None else deadline - time.monotonic()
            window = max(1, int(min(WATCH_SECONDS, remaining)))
            try:
                for event in watch.Watch().stream(
                        self.custom.list_namespaced_custom_object, api.GROUP, api.VERSION, self.namespace, api.PLURAL,
                        field_selector=f"metadata.name={self.name}", resource_version=version,
                        timeout_seconds=window, allow_watch_bookmarks=False):
                    body = event["object"]
                    if event["type"] == "ERROR":  # older clients hand the watch's error over as an event
                        version = None
                        break
                    version = str(body["metadata"]["resourceVersion"])
                    if event["type"] == "DELETED":
                        phase = (self._seen or {}).get("status", {}).get(STATUS_PHASE) or PHASE_PENDING
                        raise JobDeleted(f"{api.KIND} {self.namespace}/{self.name} was deleted while {phase}; "
                                         "what its ranks kept in S3 (results, metrics, logs) stays")
                    self._seen = body
                    yield body
            except ApiException as error:
                if error.status != 410:  # 410: the version read is too old to watch from: read the job again
                    raise
                version = None
            # The connection dropped mid-watch (urllib3 says so as a ProtocolError): read again after a pause.
            except (ConnectionError, OSError, HTTPError):
                time.sleep(poll_s)
                version = None
                dropped = time.monotonic()

    def delete(self) -> None:
        """Delete the job; its pods, Service and script ConfigMap go with it (owned by it). Its S3
        results, metrics and logs stay."""
        from kubernetes.client.rest import ApiException

        try:
            self.custom.delete_namespaced_custom_object(api.GROUP, api.VERSION, self.namespace, api.PLURAL, self.name,
                                                        propagation_policy="Background")
        except ApiException as error:
            if error.status != 404:
                raise

    # --- S3 --------------------------------------------------------------------------------------

    def store(self) -> ResultsPrefix:
        """The job's results prefix, with spec.s3's endpoint and its Secret's credentials unless set here."""
        if self._store is None:
            spec_s3 = self._spec_s3()
            if not spec_s3.results:
                raise StoreError(f"{self.name} has no spec.s3.results: its ranks keep no results, metrics or logs in S3")
            secret_name = spec_s3.credentials_secret
            secret = None
            if secret_name and not self.s3_access.access_key_id:
                secret = self._credentials_secret(secret_name)
            bundle = spec_s3.ca_bundle
            ca_file = self._ca_bundle(bundle) if bundle and not self.s3_access.ca_bundle else None
            access = self.s3_access.over(job_access(spec_s3, secret, secret_name, ca_file))
            self._store = ResultsPrefix(access, spec_s3.results, self.namespace, self.name)
        return self._store

    def _spec_s3(self) -> S3Spec:
        """spec.s3; for a deleted job, as last seen or the results URI given to the handle."""
        return S3Spec.from_spec((self._last_known().get("spec") or {}).get("s3"))

    def _ca_bundle(self, bundle: CABundle) -> str:
        """spec.s3.caBundle's certificates, read through the API into a local file."""
        from kubernetes.client.rest import ApiException

        name = bundle.config_map
        try:
            config_map = self.api_client.sanitize_for_serialization(self.core.read_namespaced_config_map(name, self.namespace))
        except ApiException as error:
            raise StoreError(f"cannot read the job's S3 CA bundle, ConfigMap {self.namespace}/{name} ({error.status} "
                             f"{error.reason}); give its file as {envnames.S3_CA_BUNDLE}") from None
        return ca_bundle_file(config_map, bundle.key, CA_BUNDLES)

    def _credentials_secret(self, name: str) -> dict[str, Any]:
        from kubernetes.client.rest import ApiException

        try:
            secret: dict[str, Any] = self.api_client.sanitize_for_serialization(
                self.core.read_namespaced_secret(name, self.namespace))
        except ApiException as error:
            raise StoreError(f"cannot read the job's S3 credentials, Secret {self.namespace}/{name} ({error.status} "
                             f"{error.reason}); give them as AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or "
                             "--s3-access-key-id/--s3-secret-access-key") from None
        return secret

    @overload
    def results(self, download: None = None) -> list[ResultFile]: ...

    @overload
    def results(self, download: str | Path) -> list[Path]: ...

    def results(self, download: str | Path | None = None) -> list[ResultFile] | list[Path]:
        """What the ranks submitted (`submit_result`): listed, or downloaded under `download` (the
        local paths, each at its result path below it)."""
        found = [ResultFile(key.removeprefix(f"{layout.RESULTS}/"), size)
                 for key, size in self.store().list(layout.RESULTS)]
        if download is None:
            return found
        return self._download(layout.RESULTS, "result", [item.path for item in found], Path(download))

    @overload
    def kept(self, download: None = None) -> list[KeptFile]: ...

    @overload
    def kept(self, download: str | Path) -> list[Path]: ...

    def kept(self, download: str | Path | None = None) -> list[KeptFile] | list[Path]:
        """The files of the folders the job keeps (spec.keepFolders), as they are in S3: listed, or
        downloaded under `download` (`<download>/<folder>/<file>`; `--logdir <download>` for TensorBoard)."""
        found = [KeptFile(key.removeprefix(f"{layout.KEPT}/"), size) for key, size in self.store().list(layout.KEPT)]
        if download is None:
            return found
        return self._download(layout.KEPT, "kept file", [item.path for item in found], Path(download))

    def _download(self, folder: str, noun: str, paths: list[str], root: Path) -> list[Path]:
        """Each of `paths` (relative to the job's `folder`) to `root / path`; none if any would land outside."""
        for path in paths:  # all checked before any is written
            local = Path(path)  # on Windows, '\\' separates parts and 'C:' anchors a path too
            if not layout.is_result_path(path) or local.anchor or ".." in local.parts:  # another program's key
                raise StoreError(f"{noun} {self.store().uri}/{folder}/{path} is not named as {noun}s are (a relative "
                                 f"path without empty, '.' or '..' parts): it could be written outside {root}, so "
                                 "nothing was downloaded")
        return [self.store().download(f"{folder}/{path}", root / path) for path in paths]

    def metrics(self) -> list[metricdata.Record]:
        """Every rank's metric records: its `log_metrics` lines, else the per-step result files it submitted
        as dask-pytorch-ddp's workers do (results/worker/<rank>/), else the metric lines it printed. An
        object read before is read again only where it grew (a live dashboard asks every few seconds)."""
        store = self.store()
        listed = [(key, size) for key, size in store.list(layout.METRICS) if key.endswith(".jsonl")]
        unread = [key for key, size in listed if (known := self._metric_parts.get(key)) is None or known[0] != size]
        with ThreadPoolExecutor(max_workers=METRIC_PART_READERS) as pool:
            # The parts come in side by side, each parsed here as it arrives while the next ones still come.
            arriving = zip(unread, pool.map(store.get, unread), strict=True)
            fresh = {key: metricdata.parse_lines(body, f"{store.uri}/{key}") for key, body in arriving}
        parts = {key: (size, fresh[key]) if key in fresh else self._metric_parts[key] for key, size in listed}
        self._metric_parts = parts
        records = [record for _, part in parts.values() for record in part]
        dask_keys = [key for key, _ in store.list(f"{layout.RESULTS}/{metricdata.DASK_WORKER_FOLDER}")
                     if key.endswith(".json")]
        unread = [key for key in dask_keys if key not in self._dask_bodies]
        with ThreadPoolExecutor(max_workers=RESULT_FILE_READERS) as pool:  # one small object per step
            self._dask_bodies.update(zip(unread, pool.map(store.get, unread), strict=True))
        for order, key in enumerate(dask_keys):
            record = metricdata.dask_result_record(key.removeprefix(f"{layout.RESULTS}/"), self._dask_bodies[key], order)
            if record is not None:
                records.append(record)
        return metricdata.best_sources(records)

    def attempt_causes(self) -> dict[int, dict[str, Any]]:
        """Why each attempt after the first began (a gang restart or a resize), as its rank 0 kept it in S3
        from status.attemptCause: attempt -> {"reason", "message", "time"}. They outlive the Events (an hour)
        and the job."""
        return self._restart_records(layout.parse_attempt_cause, self._causes)

    def attempt_recoveries(self) -> dict[int, dict[str, Any]]:
        """Where each attempt after the first resumed from, as its rank 0 kept it in S3 from status.recovery
        (ddp_contract.recoveries): attempt -> {"step", "source", "pods", "stepsLost", ...}."""
        return self._restart_records(layout.parse_attempt_recovery, self._recoveries)

    def _restart_records(self, parse: Callable[[str], int | None], seen: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
        store = self.store()
        for key, _ in store.list(layout.RESTARTS):
            attempt = parse(key)
            if attempt is None or attempt in seen:
                continue
            try:
                found = json.loads(store.get(key))
            except ValueError:  # not ours
                continue
            if isinstance(found, dict):
                seen[attempt] = found
        return dict(seen)

    def plot(self, path: str | Path, metrics: list[str] | None = None, rank: int | None = 0) -> metricdata.Series:
        """Loss and every other logged metric (or those named) against the step, one panel each, to a
        PNG; returns the series as drawn (rank 0's; None: every rank's mean per step)."""
        from .plot import plot_series

        series = metricdata.series(self.metrics(), rank)
        if metrics is not None:
            missing = [m for m in metrics if m not in series]
            if missing:
                raise ValueError(f"{self.name} logged no metric {', '.join(missing)}; it logged {', '.join(series)}")
            series = {m: series[m] for m in metrics}
        return plot_series(series, Path(path), title=f"{self.namespace}/{self.name}")

    # --- logs ------------------------------------------------------------------------------------

    def kept_attempts(self) -> dict[int, dict[int, list[str]]]:
        """Log parts kept in S3: attempt -> rank -> the parts' keys, in order."""
        return {attempt: {rank: [key for key, _ in parts] for rank, parts in by_rank.items()}
                for attempt, by_rank in self._kept_logs().parts().items()}

    def log_texts(self, attempt: int | None = None, rank: int | None = None) -> tuple[int | None, dict[int, str]]:
        """(attempt, rank -> output): from the pods while they exist and their logs can be read, else
        from what the ranks kept in S3; the kept copy where it holds more than the pod's log (the
        kubelet rotates long logs away). Default attempt: the pods' (else the newest kept)."""
        pods = self.pods()
        kept = self._kept_logs() if self._spec_s3().results else None
        return logsources.rank_texts(pods, partial(logsources.pod_log, self.core, self.namespace), kept, attempt, rank)

    def _kept_logs(self) -> logsources.KeptLogs:
        """The log parts kept under the job's results prefix (read again only where they grew)."""
        if self._kept is None:
            self._kept = logsources.KeptLogs(self.store())
        return self._kept

    def logs(self, rank: int | None = None, follow: bool = False, attempt: int | None = None,
             out: IO[str] | None = None, poll_s: float = POLL_SECONDS) -> str:
        """Every rank's output (or one rank's), each line `[rank N] `, the failed rank first. With
        `follow`, new lines go to `out` (stdout) as they come until the job finishes."""
        if follow:
            return self._follow(rank, attempt, out or sys.stdout, poll_s)
        shown, texts = self.log_texts(attempt, rank)
        return logtext.merge(texts, logtext.failed_rank(self._status_or_none(), shown))

    def _follow(self, rank: int | None, attempt: int | None, out: IO[str], poll_s: float) -> str:
        follower, shown, written = logtext.Follower(), attempt, []

        def emit(text: str) -> None:
            if text:
                out.write(text)
                out.flush()
                written.append(text)

        while True:
            try:
                status = self.status()
                finished = status.get(STATUS_PHASE) in summary.FINISHED
            except LookupError:  # deleted (ttlSecondsAfterFinished): what is left is in S3
                if self._seen is None and self.results_uri is None:
                    raise
                status, finished = self._status_or_none(), True
            current, texts = self.log_texts(attempt, rank)
            if current != shown and shown is not None:
                emit(f"--- attempt {current} ---\n")
                follower = logtext.Follower()
            shown = current
            emit(follower.new_lines(texts, logtext.failed_rank(status, current), final=finished))
            if finished:
                return "".join(written)
            time.sleep(poll_s)


def process_results(job: Job, prefix: str | Path, raise_errors: bool = True,
                    wait: Callable[..., dict[str, Any]] | None = None) -> list[Path]:
    """dask-pytorch-ddp's `rh.process_results(prefix, futures, raise_errors)` for a DDPJob: hold until
    the job finishes, then download everything the ranks submitted under `prefix` (from a failed
    job too, before JobFailed is raised)."""
    try:
        (wait or job.wait)(raise_on_failure=raise_errors)
    except JobFailed:
        job.results(download=prefix)
        raise
    return job.results(download=prefix)
