"""Progress and the last checkpoint into the DDPJob's own status, through the API server.

The operator gives each job's ranks a ServiceAccount whose Role allows `get` and `patch` on that
one DDPJob's status subresource and nothing else; rank 0 merge-patches `status.progress` and
`status.lastCheckpoint` with it. A failed write is logged and dropped: status is a courtesy and must
never stop training.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from ddp_contract import envnames as names
from ddp_contract import kubeclient
from ddp_contract.api import GROUP, PLURAL, VERSION
from ddp_contract.jobstatus import STATUS_PROGRESS
from ddp_contract.timestamps import rfc3339

from . import env

log = logging.getLogger(__name__)

KUBECONFIG_ENV = "KUBECONFIG"


class JobStatusSink:
    def __init__(self, namespace: str, name: str, api_client: Any = None, quiet_s: float = 60.0) -> None:
        # api_client: the pod's service account (or $KUBECONFIG outside a cluster) unless given.
        from kubernetes import client

        self.api = client.CustomObjectsApi(api_client or kubeclient.api_client())
        self.namespace = namespace
        self.name = name
        self.quiet_s = quiet_s
        self._last_warning = float("-inf")

    def __call__(self, record: dict[str, Any]) -> None:
        self.patch({STATUS_PROGRESS: record})

    def patch(self, fields: dict[str, Any]) -> bool:
        """Merge `fields` into the job's status; False (logged, rate-limited) when the write failed."""
        return self.patched(fields) is not None

    def patched(self, fields: dict[str, Any]) -> dict[str, Any] | None:
        """Merge `fields` into the job's status: the job as the API server returned it, None (logged,
        rate-limited) when the write failed."""
        try:
            job = self.api.patch_namespaced_custom_object_status(
                GROUP, VERSION, self.namespace, PLURAL, self.name, {"status": fields}, _request_timeout=10,
            )
            return job if isinstance(job, dict) else {}
        except Exception as error:  # noqa: BLE001 - see the module docstring
            now = time.monotonic()
            if now - self._last_warning >= self.quiet_s:
                self._last_warning = now
                log.warning("could not write %s to DDPJob %s/%s: %s", ", ".join(fields), self.namespace, self.name,
                            error)
            return None


def last_checkpoint(step: int, uri: str, now: float | None = None) -> dict[str, Any]:
    """status.lastCheckpoint: the newest committed checkpoint, which a restarted gang resumes from."""
    return {"step": int(step), "uri": uri, "time": rfc3339(time.time() if now is None else now)}


def in_cluster_sink() -> JobStatusSink | None:
    """The sink for this rank's DDPJob when it runs under the operator, else None."""
    name = os.environ.get(names.JOB_NAME)
    if not name or not (os.environ.get(kubeclient.IN_CLUSTER_ENV) or os.environ.get(KUBECONFIG_ENV)):
        return None
    return JobStatusSink(os.environ.get(names.JOB_NAMESPACE, env.DEFAULT_JOB_NAMESPACE), name)


def rendezvous(attempt: int, formed_s: float, check_s: float | None, now: float | None = None) -> dict[str, Any]:
    """status.rendezvous: how long this attempt's gang took to form, and its all-reduce check (the
    runtime's own, which a command's rank 0 does not run: None)."""
    record: dict[str, Any] = {"attempt": int(attempt), "formedSeconds": round(formed_s, 3),
                              "time": rfc3339(time.time() if now is None else now)}
    if check_s is not None:
        record["allReduceMillis"] = round(check_s * 1000, 3)
    return record


def record(fields: dict[str, Any]) -> bool:
    """Merge `fields` into this rank's job's status when it runs under the operator; never raises."""
    return recorded(fields) is not None


def recorded(fields: dict[str, Any], sink: JobStatusSink | None = None) -> dict[str, Any] | None:
    """record(), returning the job as the API server returned it (None: not written)."""
    try:
        sink = sink or in_cluster_sink()
    except Exception as error:  # noqa: BLE001 - e.g. no service-account token: the log still has it
        log.warning("cannot write %s to the DDPJob status: %s", ", ".join(fields), error)
        return None
    return sink.patched(fields) if sink is not None else None
