"""Progress into the DDPJob's own status, through the API server.

The operator gives each job's ranks a ServiceAccount whose Role allows `get` and `patch` on that
one DDPJob's status subresource and nothing else; rank 0 merge-patches `status.progress` with it.
A failed write is logged and dropped: progress is a courtesy and must never stop training.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from ddp_contract import envnames as names
from ddp_contract import kubeclient
from ddp_contract.api import GROUP, PLURAL, VERSION

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
        try:
            self.api.patch_namespaced_custom_object_status(
                GROUP, VERSION, self.namespace, PLURAL, self.name, {"status": {"progress": record}},
                _request_timeout=10,
            )
        except Exception as error:  # noqa: BLE001 - see the module docstring
            now = time.monotonic()
            if now - self._last_warning >= self.quiet_s:
                self._last_warning = now
                log.warning("could not write progress to DDPJob %s/%s: %s", self.namespace, self.name, error)


def in_cluster_sink() -> JobStatusSink | None:
    """The sink for this rank's DDPJob when it runs under the operator, else None."""
    name = os.environ.get(names.JOB_NAME)
    if not name or not (os.environ.get(kubeclient.IN_CLUSTER_ENV) or os.environ.get(KUBECONFIG_ENV)):
        return None
    return JobStatusSink(os.environ.get(names.JOB_NAMESPACE, env.DEFAULT_JOB_NAMESPACE), name)
