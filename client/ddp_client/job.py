"""A handle on one DDPJob: wait for it, read its logs, results and metrics, plot them, delete it."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, overload

from ddp_contract import api, labels, layout

from . import logs as logtext
from . import metrics as metricdata
from . import summary
from .store import JobStore, S3Access, StoreError, job_access

POLL_SECONDS = 2.0


class JobFailed(RuntimeError):
    """The job ended Failed; the message says why and shows the failed rank's last output."""

    def __init__(self, text: str, status: dict[str, Any]) -> None:
        super().__init__(text)
        self.status = status


@dataclass(frozen=True)
class ResultFile:
    path: str  # relative to the job's results/, as the rank gave it to submit_result
    size: int


class Job:
    """One DDPJob, by name, through a Kubernetes API client. S3 settings for its results, logs and
    metrics: `s3_access` where given, else $DDP_S3_ENDPOINT, $DDP_S3_REGION/$AWS_REGION,
    $AWS_ACCESS_KEY_ID and $AWS_SECRET_ACCESS_KEY where set, else the job's own (spec.s3's endpoint
    and region, its credentials Secret read through the API)."""

    def __init__(self, name: str, namespace: str, api_client: Any, s3_access: S3Access | None = None,
                 results_uri: str | None = None) -> None:
        from kubernetes import client

        self.name = name
        self.namespace = namespace
        self.api_client = api_client
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.s3_access = S3Access.from_env() if s3_access is None else s3_access
        self.results_uri = results_uri  # spec.s3.results, for a job already deleted (ttlSecondsAfterFinished)
        self._store: JobStore | None = None

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
        return body

    def status(self) -> dict[str, Any]:
        return dict(self.get().get("status") or {})

    def _status_or_none(self) -> dict[str, Any]:
        """The status, or nothing for a deleted job whose results URI was given."""
        try:
            return self.status()
        except LookupError:
            if self.results_uri is None:
                raise
            return {}

    def pods(self) -> list[dict[str, Any]]:
        found = self.core.list_namespaced_pod(self.namespace, label_selector=f"{labels.LABEL_JOB_NAME}={self.name}")
        pods: list[dict[str, Any]] = self.api_client.sanitize_for_serialization(found.items)
        return pods

    def summary(self) -> str:
        return summary.status_text(self.get(), self.pods())

    def wait(self, timeout: float | None = None, out: IO[str] | None = sys.stderr, raise_on_failure: bool = True,
             poll_s: float = POLL_SECONDS) -> dict[str, Any]:
        """Until the job Succeeded or Failed, a progress line (epoch, step, loss, samples/s) on `out`;
        then the outcome, and on failure the reason and the failed rank's last output (JobFailed)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        shown = ""
        while True:
            status = self.status()
            line = summary.progress_line(self.name, status)
            if out is not None and line != shown:
                _overwrite(out, line, shown)
                shown = line
            if status.get("phase") in summary.FINISHED:
                break
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} is still {status.get('phase') or 'Pending'} after {timeout}s")
            time.sleep(poll_s)
        outcome = summary.outcome_text(self.name, status)
        if out is not None:
            _overwrite(out, "", shown)
            print(outcome, file=out, flush=True)
        if raise_on_failure and status.get("phase") == "Failed":
            raise JobFailed(outcome, status)
        return status

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

    def store(self) -> JobStore:
        """The job's results prefix, with spec.s3's endpoint and its Secret's credentials unless set here."""
        if self._store is None:
            spec_s3 = self._spec_s3()
            if not spec_s3.get("results"):
                raise StoreError(f"{self.name} has no spec.s3.results: its ranks keep no results, metrics or logs in S3")
            secret_name = spec_s3.get("credentialsSecret")
            secret = None
            if secret_name and not self.s3_access.access_key_id:
                secret = self._credentials_secret(secret_name)
            access = self.s3_access.over(job_access(spec_s3, secret, secret_name))
            self._store = JobStore(access, spec_s3["results"], self.namespace, self.name)
        return self._store

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
        root = Path(download)
        return [self.store().download(f"{layout.RESULTS}/{item.path}", root / item.path) for item in found]

    def metrics(self) -> list[metricdata.Record]:
        """Every rank's `log_metrics` records, from the per-rank JSON lines."""
        records: list[metricdata.Record] = []
        for key, _ in self.store().list(layout.METRICS):
            if key.endswith(".jsonl"):
                records.extend(metricdata.parse_lines(self.store().get(key).decode(), f"{self.store().uri}/{key}"))
        return records

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
        attempts: dict[int, dict[int, list[str]]] = {}
        for key, _ in self.store().list(layout.LOGS):
            part = layout.parse_log_part(key)
            if part is not None:
                attempts.setdefault(part.attempt, {}).setdefault(part.rank, []).append(key)
        return attempts

    def log_texts(self, attempt: int | None = None, rank: int | None = None) -> tuple[int | None, dict[int, str]]:
        """(attempt, rank -> output): from the pods while they exist and their logs can be read, else
        from what the ranks kept in S3. Default attempt: the pods' (else the newest kept)."""
        pods = [p for p in self.pods() if not (p.get("metadata") or {}).get("deletionTimestamp")]
        pod_attempts = {int(p["metadata"]["labels"][labels.LABEL_ATTEMPT]) for p in pods}
        if attempt is None and pod_attempts:
            attempt = max(pod_attempts)
        texts: dict[int, str] = {}
        for pod in pods:
            meta = pod["metadata"]
            pod_rank = int(meta["labels"][labels.LABEL_RANK])
            if int(meta["labels"][labels.LABEL_ATTEMPT]) == attempt and rank in (None, pod_rank):
                text = self._pod_log(meta["name"])
                if text is not None:
                    texts[pod_rank] = text
        kept = self._kept(attempt)
        if kept is not None:
            attempt, by_rank = kept
            for kept_rank, keys in by_rank.items():
                if rank in (None, kept_rank) and kept_rank not in texts:
                    texts[kept_rank] = "".join(self.store().get(key).decode(errors="replace") for key in keys)
        return attempt, texts

    def _spec_s3(self) -> dict[str, Any]:
        """spec.s3, or for a deleted job the results URI given to the handle (credentials from it or the env)."""
        try:
            return dict((self.get().get("spec") or {}).get("s3") or {})
        except LookupError:
            if self.results_uri is None:
                raise
            return {"results": self.results_uri}

    def _kept(self, attempt: int | None) -> tuple[int, dict[int, list[str]]] | None:
        if not self._spec_s3().get("results"):
            return None
        attempts = self.kept_attempts()
        if attempt is None:
            return (max(attempts), attempts[max(attempts)]) if attempts else None
        return (attempt, attempts[attempt]) if attempt in attempts else None

    def _pod_log(self, pod: str) -> str | None:
        """A pod's trainer log, or None where the API cannot serve it (no kubelet to ask, container gone)."""
        from kubernetes.client.rest import ApiException
        from urllib3.exceptions import HTTPError

        try:
            text: str = self.core.read_namespaced_pod_log(pod, self.namespace, container=labels.CONTAINER_NAME)
            return text
        except (ApiException, HTTPError):
            return None

    def logs(self, rank: int | None = None, follow: bool = False, attempt: int | None = None,
             out: IO[str] | None = None, poll_s: float = POLL_SECONDS) -> str:
        """Every rank's output (or one rank's), each line `[rank N] `, the failed rank first. With
        `follow`, new lines go to `out` (stdout) as they come until the job finishes."""
        if follow:
            return self._follow(rank, attempt, out or sys.stdout, poll_s)
        shown, texts = self.log_texts(attempt, rank)
        return logtext.merge(texts, failed_rank(self._status_or_none(), shown))

    def _follow(self, rank: int | None, attempt: int | None, out: IO[str], poll_s: float) -> str:
        follower, shown, written = logtext.Follower(), attempt, []

        def emit(text: str) -> None:
            if text:
                out.write(text)
                out.flush()
                written.append(text)

        while True:
            status = self.status()
            finished = status.get("phase") in summary.FINISHED
            current, texts = self.log_texts(attempt, rank)
            if current != shown and shown is not None:
                emit(f"--- attempt {current} ---\n")
                follower = logtext.Follower()
            shown = current
            emit(follower.new_lines(texts, failed_rank(status, current), final=finished))
            if finished:
                return "".join(written)
            time.sleep(poll_s)


def failed_rank(status: dict[str, Any], attempt: int | None) -> int | None:
    """The rank whose failure ended `attempt` (status.failedRank), if that attempt's failure is the one recorded."""
    failed = status.get("failedRank") or {}
    if failed.get("rank") is None or failed.get("attempt") not in (None, attempt):
        return None
    return int(failed["rank"])


def _overwrite(out: IO[str], line: str, previous: str) -> None:
    """Rewrite the progress line in place on a terminal; one line per change elsewhere (a notebook, a file)."""
    if out.isatty():
        out.write("\r" + line.ljust(len(previous)) + ("" if line else "\r"))
    elif line:
        out.write(line + "\n")
    out.flush()


def process_results(job: Job, prefix: str | Path, raise_errors: bool = True,
                    wait: Callable[..., dict[str, Any]] | None = None) -> list[Path]:
    """dask-pytorch-ddp's `rh.process_results(prefix, futures, raise_errors)` for a DDPJob: hold until
    the job finishes, then download everything the ranks submitted under `prefix`."""
    (wait or job.wait)(raise_on_failure=raise_errors)
    return job.results(download=prefix)
