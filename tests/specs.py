"""DDPJob spec fixtures shared by the unit tests and the CRD tests."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any


def changed(base: Mapping[str, Any], **changes: Any) -> dict[str, Any]:
    """A deep copy of base with fields replaced; a None value removes the field."""
    spec = copy.deepcopy(dict(base))
    for key, value in changes.items():
        if value is None:
            spec.pop(key, None)
        else:
            spec[key] = value
    return spec


# A pod template setting a field of every kind a user sets: merged into each rank's pod
# (operator/unit/test_manifests.py) and accepted as it is by the CRD (operator/cluster/test_crd_validation.py).
FULL_TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"team": "vision"}, "annotations": {"note": "x"}},
    "spec": {
        "restartPolicy": "Never",
        "nodeSelector": {"gpu": "a100"},
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}},
        "serviceAccountName": "trainer",
        "imagePullSecrets": [{"name": "regcred"}],
        "priorityClassName": "high",
        "schedulerName": "volcano",
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
        "containers": [
            {
                "name": "trainer",
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                "env": [{"name": "EXTRA", "value": "1"}],
                "imagePullPolicy": "Always",
            },
            {"name": "logger", "image": "fluent-bit:3", "args": ["-v"]},
        ],
        "enableServiceLinks": True,
        "securityContext": {"runAsUser": 1000},
    },
}
