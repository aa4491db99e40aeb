"""Kubernetes Events on a DDPJob, shown by `kubectl describe ddpjob`."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.rest import ApiException

from ddp_contract import api
from ddp_operator.kubeapi import KubeApi, api_message, is_going_away

log = logging.getLogger(__name__)
COMPONENT = "ddp-operator"
MAX_MESSAGE = 1024


def build_event(job: Mapping[str, Any], *, type_: str, reason: str, message: str, now: datetime) -> dict[str, Any]:
    meta = job["metadata"]
    stamp = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": api.API_VERSION,
            "kind": api.KIND,
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
            "resourceVersion": meta.get("resourceVersion"),
        },
        "type": type_,
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


async def post_event(kube: KubeApi, job: Mapping[str, Any], *, type_: str, reason: str, message: str) -> None:
    """Posts an Event; a failure is logged, never raised: events are a courtesy, not state."""
    event = build_event(job, type_=type_, reason=reason, message=message, now=datetime.now(UTC))
    try:
        await kube.send(kube.core.create_namespaced_event, event["metadata"]["namespace"], event, status=True)
    except ApiException as error:
        level = logging.DEBUG if is_going_away(error) else logging.WARNING
        log.log(level, "could not post event %s on %s: %s", reason, job["metadata"]["name"], api_message(error))
    except Exception as error:  # noqa: BLE001 - an Event is a courtesy: no failure of it may stop a pass
        log.warning("could not post event %s on %s: %s", reason, job["metadata"]["name"], error)
