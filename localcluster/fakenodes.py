"""kwok's fake nodes are tainted, so ordinary pods land on the real node (where images must exist);
what is meant for the fake nodes (the operator's tests and benchmark: kwok fakes Running for any
image) says so with this toleration and node selector, as cluster.sh labels and taints them."""

from __future__ import annotations

import json
from typing import Any

FAKE_NODE_TOLERATION = {"key": "kwok.x-k8s.io/node", "operator": "Equal", "value": "fake", "effect": "NoSchedule"}
FAKE_NODE_SELECTOR = {"type": "kwok"}
# The same for every pod of a namespace, for manifests that must stay as a user writes them (the
# README's quick start): the API server's PodNodeSelector and PodTolerationRestriction plugins add
# these to each pod the namespace gets.
FAKE_NODE_NAMESPACE_ANNOTATIONS = {
    "scheduler.alpha.kubernetes.io/node-selector": ",".join(f"{k}={v}" for k, v in FAKE_NODE_SELECTOR.items()),
    "scheduler.alpha.kubernetes.io/defaultTolerations": json.dumps([FAKE_NODE_TOLERATION]),
}


def on_fake_nodes(pod_spec: dict[str, Any]) -> dict[str, Any]:
    """A copy of a pod spec (or a DDPJob template's spec) that is scheduled onto kwok's fake nodes only."""
    return {
        **pod_spec,
        "tolerations": [*pod_spec.get("tolerations", []), FAKE_NODE_TOLERATION],
        "nodeSelector": {**pod_spec.get("nodeSelector", {}), **FAKE_NODE_SELECTOR},
    }
