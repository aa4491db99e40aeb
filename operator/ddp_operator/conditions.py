"""metav1.Condition lists, as the job's status and Kueue's Workloads keep them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from ddp_contract.timestamps import rfc3339


def set_condition(
    conditions: Iterable[Mapping[str, Any]],
    type_: str,
    *,
    status: bool | str,
    reason: str,
    message: str,
    now: datetime,
    generation: int | None = None,
) -> list[dict[str, Any]]:
    """A new list with the condition `type_` set; lastTransitionTime moves only when status flips."""
    value = ("True" if status else "False") if isinstance(status, bool) else status
    result = [dict(cond) for cond in conditions]
    current = next((cond for cond in result if cond.get("type") == type_), None)
    updated: dict[str, Any] = {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": rfc3339(now),
    }
    if generation is not None:
        updated["observedGeneration"] = generation
    if current is None:
        return [*result, updated]
    if current.get("status") == value and current.get("lastTransitionTime"):
        updated["lastTransitionTime"] = current["lastTransitionTime"]
    current.clear()
    current.update(updated)
    return result


def get_condition(conditions: Iterable[Mapping[str, Any]], type_: str) -> Mapping[str, Any] | None:
    return next((cond for cond in conditions if cond.get("type") == type_), None)
