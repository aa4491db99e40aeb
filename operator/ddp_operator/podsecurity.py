"""Rank pods that satisfy the `restricted` Pod Security Standard unless their template says otherwise.

The profile asks of every container (init containers and sidecars too): a non-root user
(`runAsNonRoot: true`, no `runAsUser: 0`), the runtime's default seccomp profile,
`allowPrivilegeEscalation: false` and every capability dropped. Each is filled in only where the
template leaves it unset: a template that sets a field (the root user, a capability it adds, its own
seccomp profile) keeps its value, and the namespace's Pod Security level then decides whether the pod
may run. Which user the pod runs as is the image's (the trainer image's is 1000): a root image is
refused by the kubelet, and the job says so (`ImageRunsAsRoot`).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Mapping
from typing import Any

RUNTIME_DEFAULT_SECCOMP = {"type": "RuntimeDefault"}
# What the kubelet says (CreateContainerConfigError) of an image it will not start under runAsNonRoot.
ROOT_IMAGE_MARKS = ("runAsNonRoot and image will run as root", "image has non-numeric user")
ROOT_IMAGE_ADVICE = ("rank pods run as a non-root user unless their template says otherwise (the restricted Pod "
                     "Security profile): build the image with a numeric non-root USER (the trainer image's is "
                     "1000), or set spec.template.spec.securityContext.runAsUser (e.g. 1000), or runAsNonRoot: false "
                     "where the namespace allows root")


def with_restricted_defaults(pod_spec: Mapping[str, Any]) -> dict[str, Any]:
    """`pod_spec` with the restricted profile's fields filled in where it leaves them unset."""
    spec = copy.deepcopy(dict(pod_spec))
    pod = dict(spec.get("securityContext") or {})
    containers = list(_all_containers(spec))
    if not _asks_for_root(pod, containers):
        pod.setdefault("runAsNonRoot", True)
    if not any((c.get("securityContext") or {}).get("seccompProfile") for c in containers):
        pod.setdefault("seccompProfile", dict(RUNTIME_DEFAULT_SECCOMP))
    spec["securityContext"] = pod
    for container in containers:
        context = container.setdefault("securityContext", {})
        privileged = bool(context.get("privileged"))
        if not privileged:
            context.setdefault("allowPrivilegeEscalation", False)
        if not privileged and "capabilities" not in context:
            context["capabilities"] = {"drop": ["ALL"]}
    return spec


def _all_containers(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every container and init container of `spec`, as the dicts inside it (to change in place)."""
    for field in ("initContainers", "containers"):
        items = [dict(c) for c in spec.get(field) or []]
        spec[field] = items
        yield from items
    if not spec.get("initContainers"):
        spec.pop("initContainers", None)


def _asks_for_root(pod: Mapping[str, Any], containers: list[dict[str, Any]]) -> bool:
    """Whether the template runs anything as root on purpose (uid 0, or runAsNonRoot false): then no
    runAsNonRoot is added, which the kubelet would refuse as a contradiction."""
    contexts = [pod, *((c.get("securityContext") or {}) for c in containers)]
    return any(ctx.get("runAsUser") == 0 or ctx.get("runAsNonRoot") is False for ctx in contexts)


def root_image_problem(kubelet_message: str) -> str | None:
    """The kubelet refusing to start a root image because of runAsNonRoot, with what to do; None otherwise."""
    if not any(mark in kubelet_message for mark in ROOT_IMAGE_MARKS):
        return None
    # The pod's own name is left out ("(pod: "train-3_ns(uid)", container: trainer)"): ranks refused
    # alike are said together.
    said = re.sub(r' \(pod: "[^"]*", container: [^)]*\)', "", kubelet_message.strip())
    return f"{said}: {ROOT_IMAGE_ADVICE}"
