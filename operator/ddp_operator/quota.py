"""Whether a namespace's ResourceQuotas admit a whole gang, before any of its pods is created.

A quota admits pods one at a time, so a gang it cannot hold whole is created in part: the first
ranks run and hold the team's GPUs while the rest are refused (the partial gang). The operator
therefore counts what the gang's pods would use, as the API server will count it, against what each
quota that covers them has left, and creates none of them when one would not fit.

Counted as the API server counts (pkg/quota/v1/evaluator/core/pods.go): a container's requests
default to its limits; LimitRange defaults fill what a container leaves unset (the LimitRanger
admission plugin runs before the quota's); a pod's usage is its containers' sum or its largest init
container's, whichever is larger. Only the resources a quota can hold for pods are judged; a quota
whose scope does not cover the pods (Terminating, BestEffort, PriorityClass, ...) is skipped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from ddp_operator import constants as c
from ddp_operator.capacity import parse_quantity

COMPUTE: Final = ("cpu", "memory", "ephemeral-storage")
# Quota names that count pods' requests under a name without the "requests." prefix.
PLAIN_REQUESTS: Final = {resource: f"requests.{resource}" for resource in COMPUTE}
# A quota on one of these makes every container say it (else "failed quota: must specify ...").
MUST_SPECIFY = {"requests.cpu": ("requests", "cpu"), "requests.memory": ("requests", "memory"),
                "limits.cpu": ("limits", "cpu"), "limits.memory": ("limits", "memory"),
                "cpu": ("requests", "cpu"), "memory": ("requests", "memory")}


@dataclass(frozen=True)
class Shortfall:
    """Why the gang does not fit a quota: status.reason (QuotaExceeded, or QuotaRequiresResources when
    a container leaves unset what a quota counts) and the words for status.message."""

    reason: str
    message: str


def gang_shortfall(pods: Sequence[Mapping[str, Any]], quotas: Iterable[Mapping[str, Any]], *,
                   limit_ranges: Iterable[Mapping[str, Any]] = (),
                   leaving: Sequence[Mapping[str, Any]] = (), created: int = 0, rest: bool = False) -> Shortfall | None:
    """Whether the namespace's quotas refuse any of `pods` (a whole gang, or with `rest` the ranks an
    elastic job left out); None if every quota that covers them has room for all of them. `leaving`:
    pods the quotas still count (an old attempt's, being deleted) that free what they hold before the
    gang needs it. `created`: how many of the gang's pods are created all the same (an elastic job's
    that fit), for the message."""
    if not pods:
        return None
    defaults = container_defaults(limit_ranges)
    specs = [with_defaults(pod.get("spec") or {}, defaults) for pod in pods]
    freed = [with_defaults(pod.get("spec") or {}, defaults) for pod in leaving]
    for quota in sorted(quotas, key=lambda q: q.get("metadata", {}).get("name", "")):
        name = quota.get("metadata", {}).get("name", "")
        status = quota.get("status") or {}
        hard, used = status.get("hard"), status.get("used") or {}
        if not hard:  # not yet counted by the quota controller: the API server decides
            continue
        covered = [spec for spec in specs if covers(quota, spec)]
        if not covered:
            continue
        unsaid = unspecified(covered, hard)
        if unsaid:
            return Shortfall(c.REASON_QUOTA_NEEDS_RESOURCES,
                             f"ResourceQuota {name} counts {unsaid}: set them in spec.resources (or the template's "
                             "container), or give the namespace a LimitRange default")
        wanted = total_usage(covered, hard)
        released = total_usage([spec for spec in freed if covers(quota, spec)], hard)
        over = [resource for resource, amount in wanted.items()
                if amount + max((parse_quantity(used.get(resource, 0)) or 0) - released.get(resource, 0), 0)
                > (parse_quantity(hard[resource]) or 0)]
        if over:
            return Shortfall(c.REASON_QUOTA_EXCEEDED,
                             _exceeded(name, pods=len(covered), over=over, wanted=wanted, hard=hard, used=used,
                                       created=created, rest=rest))
    return None


def pods_that_fit(pod: Mapping[str, Any], quotas: Sequence[Mapping[str, Any]], *, most: int, least: int,
                  limit_ranges: Sequence[Mapping[str, Any]] = (), leaving: Sequence[Mapping[str, Any]] = ()) -> int:
    """The most pods like `pod`, from `least` up to `most`, that the quotas hold together; 0 when not
    even `least` fit. (What fits shrinks as pods are added, so a bisection finds it.)"""
    def fit(count: int) -> bool:
        return gang_shortfall([pod] * count, quotas, limit_ranges=limit_ranges, leaving=leaving) is None

    if least > most or not fit(least):
        return 0
    low, high = least, most  # fit(low) holds
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fit(middle) else (low, middle - 1)
    return low


def container_defaults(limit_ranges: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The LimitRanges' defaults for containers: {"limits": {...}, "requests": {...}} (the first one
    to name a resource wins, as the LimitRanger applies them in turn)."""
    found: dict[str, dict[str, Any]] = {"limits": {}, "requests": {}}
    for limit_range in limit_ranges:
        for item in (limit_range.get("spec") or {}).get("limits") or []:
            if item.get("type") != "Container":
                continue
            for resource, value in (item.get("default") or {}).items():
                found["limits"].setdefault(resource, value)
            for resource, value in (item.get("defaultRequest") or item.get("default") or {}).items():
                found["requests"].setdefault(resource, value)
    return found


def with_defaults(spec: Mapping[str, Any], defaults: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """`spec` with each container's resources as the API server will hold them after admission."""
    def filled(container: Mapping[str, Any]) -> dict[str, Any]:
        resources = container.get("resources") or {}
        limits = {**defaults.get("limits", {}), **(resources.get("limits") or {})}
        requests = {**defaults.get("requests", {}), **limits, **(resources.get("requests") or {})}
        return {**container, "resources": {"limits": limits, "requests": requests}}

    return {**spec, "containers": [filled(x) for x in spec.get("containers") or []],
            "initContainers": [filled(x) for x in spec.get("initContainers") or []]}


def covers(quota: Mapping[str, Any], spec: Mapping[str, Any]) -> bool:
    """Whether the quota's scopes (all of them) select a pod with this spec."""
    quota_spec = quota.get("spec") or {}
    scopes: list[tuple[str, str, list[str]]] = [(scope, "Exists", []) for scope in quota_spec.get("scopes") or []]
    scopes += [(e.get("scopeName"), e.get("operator"), e.get("values") or [])
               for e in (quota_spec.get("scopeSelector") or {}).get("matchExpressions") or []]
    return all(_in_scope(scope, operator, values, spec) for scope, operator, values in scopes)


def _in_scope(scope: str, operator: str, values: list[str], spec: Mapping[str, Any]) -> bool:
    if scope == "PriorityClass":
        priority = spec.get("priorityClassName") or ""
        return {"In": priority in values, "NotIn": priority not in values, "Exists": bool(priority),
                "DoesNotExist": not priority}.get(operator, False)
    matched = {
        "Terminating": spec.get("activeDeadlineSeconds") is not None,
        "NotTerminating": spec.get("activeDeadlineSeconds") is None,
        "BestEffort": _best_effort(spec),
        "NotBestEffort": not _best_effort(spec),
        "CrossNamespacePodAffinity": False,  # rank pods' affinity is the template's; the API server decides
    }.get(scope, False)
    return matched if operator in ("Exists", "In") else not matched


def _best_effort(spec: Mapping[str, Any]) -> bool:
    containers = [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]
    return not any((x.get("resources") or {}).get(kind, {}).get(r)
                   for x in containers for kind in ("requests", "limits") for r in ("cpu", "memory"))


def unspecified(specs: Sequence[Mapping[str, Any]], hard: Mapping[str, Any]) -> str:
    """What a quota counts that some container leaves unset ("limits.memory for trainer"), or ""."""
    missing: list[str] = []
    for quota_name, (kind, resource) in MUST_SPECIFY.items():
        if quota_name not in hard:
            continue
        names = sorted({x.get("name", "") for spec in specs for x in [*spec["containers"], *spec["initContainers"]]
                        if resource not in (x.get("resources") or {}).get(kind, {})})
        if names:
            missing.append(f"{kind}.{resource} for {', '.join(names)}")
    return "; ".join(dict.fromkeys(missing))


def pod_usage(spec: Mapping[str, Any]) -> dict[str, Decimal]:
    """What one pod counts against a quota: pods, count/pods, requests.* and limits.* (compute and
    extended resources), and cpu/memory/ephemeral-storage as their requests. Per resource, the
    containers' sum (with the init containers that run beside them, restartPolicy Always) or the
    largest other init container, whichever is larger: those run one at a time, before the rest."""
    usage: dict[str, Decimal] = {"pods": Decimal(1), "count/pods": Decimal(1)}
    beside = [x for x in spec["initContainers"] if x.get("restartPolicy") == "Always"]
    before = [x for x in spec["initContainers"] if x.get("restartPolicy") != "Always"]
    for kind in ("requests", "limits"):
        running = _summed([*spec["containers"], *beside], kind)
        for container in before:
            for resource, amount in _summed([container], kind).items():
                running[resource] = max(running.get(resource, Decimal(0)), amount)
        usage.update((f"{kind}.{resource}", amount) for resource, amount in running.items())
    for plain, counted in PLAIN_REQUESTS.items():
        if counted in usage:
            usage[plain] = usage[counted]
    return usage


def _summed(containers: Iterable[Mapping[str, Any]], kind: str) -> dict[str, Decimal]:
    """The containers' `kind` (requests or limits), summed per resource."""
    total: dict[str, Decimal] = {}
    for container in containers:
        for resource, value in ((container.get("resources") or {}).get(kind) or {}).items():
            total[resource] = total.get(resource, Decimal(0)) + (parse_quantity(value) or Decimal(0))
    return total


def total_usage(specs: Iterable[Mapping[str, Any]], hard: Mapping[str, Any]) -> dict[str, Decimal]:
    """The gang's usage of each resource the quota holds."""
    total: dict[str, Decimal] = {}
    for spec in specs:
        for resource, amount in pod_usage(spec).items():
            if resource in hard:
                total[resource] = total.get(resource, Decimal(0)) + amount
    return total


def _exceeded(name: str, *, pods: int, over: list[str], wanted: Mapping[str, Decimal], hard: Mapping[str, Any],
              used: Mapping[str, Any], created: int = 0, rest: bool = False) -> str:
    """'ResourceQuota team: the gang's 3 pods need requests.nvidia.com/gpu=2, with 1 used of 2 (...)'."""
    parts = [f"{r}={_show(r, wanted[r])} with {used.get(r, 0)} used of {hard[r]}" for r in sorted(over)]
    made = f"only {created} of its pods are created (spec.minWorldSize)" if created else "none of its pods is created"
    whose = "its other" if rest else "the gang's"
    return (f"ResourceQuota {name} cannot hold the whole gang, so {made}: {whose} {pods} "
            f"pod{'s' if pods != 1 else ''} need {'; '.join(parts)}")


def _show(resource: str, amount: Decimal) -> str:
    if resource.endswith("memory") or resource.endswith("ephemeral-storage"):
        return f"{float(amount) / 2**30:g}Gi"
    return f"{float(amount):g}"
