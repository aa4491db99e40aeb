"""The API server refusing an object a job needs (a rank's pod, its Service, ServiceAccount, Role or
RoleBinding): which kind of refusal it is, in the server's own words, and whether waiting can help.

Only a quota can free up (another job ends, an admin raises it): the job waits for it, trying again
with a growing pause, under startupDeadlineSeconds. Everything else (Pod Security, a LimitRange, a
quota that wants resources the spec does not set, an admission webhook or policy that denies, the
operator's own RBAC, a pod the API finds invalid) refuses again until someone changes the cluster or
the spec, so the job fails at once with the refusal's reason.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from ddp_operator import constants as c
from ddp_operator.failures import PodProblem

# `pods "train-3" is forbidden: ` and the like: the object's name, which differs from rank to rank.
_NAMED = re.compile(r'^[a-z][a-z0-9.]* "[^"]*" is (?:forbidden|invalid): ')
_LIMIT_RANGE = ("usage per Container is", "usage per Pod is", "limit to request ratio per", "per PersistentVolumeClaim")

# Seconds between tries to create a gang that a quota refused: doubling from the first, up to the last.
RETRY_FIRST = 5.0
RETRY_MAX = 60.0


@dataclass(frozen=True)
class Refusal:
    """Why the API server refused to create an object: a reason for status.reason, and its words."""

    reason: str
    message: str

    @property
    def waits(self) -> bool:
        """A quota may free up, and so may a topology domain; a creation pass that raised (ReconcileError) is
        tried again too, with the same growing pauses; nothing else passes without someone changing the cluster or the spec."""
        return self.reason in (c.REASON_QUOTA_EXCEEDED, c.REASON_RECONCILE_ERROR, c.REASON_NO_TOPOLOGY_DOMAIN)

    def said_of(self, kind: str) -> str:
        """The message with what was refused in front: "the API server refused the pod: ..."."""
        return f"the API server refused the {kind}: {self.message}"


def classify(status: int | None, message: str) -> Refusal | None:
    """The refusal in an API error's status code and message; None for errors that are not one (a
    conflict, a server error, the namespace going away), which the caller handles as before."""
    said = _NAMED.sub("", message.strip(), count=1)
    if "violates PodSecurity" in said:
        return Refusal(c.REASON_POD_SECURITY, said)
    if said.startswith("exceeded quota:"):
        return Refusal(c.REASON_QUOTA_EXCEEDED, said)
    if said.startswith("failed quota:") and "must specify" in said:
        return Refusal(c.REASON_QUOTA_NEEDS_RESOURCES, f"{said} (set them in spec.resources, or a LimitRange default)")
    if any(mark in said for mark in _LIMIT_RANGE):
        return Refusal(c.REASON_LIMIT_RANGE, said.removeprefix("[").removesuffix("]"))
    if "denied the request" in said or "denied request" in said:  # a webhook; a ValidatingAdmissionPolicy
        return Refusal(c.REASON_ADMISSION_DENIED, said)
    if status == 403 and " cannot create resource " in said:
        return Refusal(c.REASON_FORBIDDEN, f"{said} (the operator's RBAC: see the chart's ClusterRole)")
    if status == 403:  # another admission plugin (PodNodeSelector, PodTolerationRestriction, ...)
        return Refusal(c.REASON_ADMISSION_DENIED, said)
    if status in (400, 422):
        return Refusal(c.REASON_INVALID_SPEC, said)
    return None


def retry_after(tries: int) -> float:
    """Seconds to wait before the next try to create a gang that a quota refused `tries` times in a row."""
    return min(RETRY_FIRST * 2 ** max(tries - 1, 0), RETRY_MAX)


@dataclass(frozen=True)
class Refused:
    """What a job's last creation pass could not create, for the status pass to say and act on: the
    ranks held up, the refusal (its message already saying what was refused), the attempt it was
    for, and when to try again (`tries` refusals in a row, monotonic `retry_at`)."""

    attempt: int
    ranks: tuple[int, ...]
    refusal: Refusal
    tries: int = 1
    retry_at: float = 0.0

    def problems(self, attempt: int, live_indices: Iterable[int]) -> tuple[PodProblem, ...]:
        """The refused ranks that still have no pod, as held-up ranks of `attempt` (none for another)."""
        if attempt != self.attempt:
            return ()
        live = set(live_indices)
        return tuple(PodProblem(rank, self.refusal.reason, self.refusal.message) for rank in self.ranks if rank not in live)

    def again(self, attempt: int, ranks: Iterable[int], refusal: Refusal, now: float) -> Refused:
        """The record after another refusal at monotonic time `now`: tries counted on while a quota
        keeps refusing the same attempt."""
        tries = self.tries + 1 if (attempt, refusal.reason) == (self.attempt, self.refusal.reason) else 1
        return refused(attempt, ranks, refusal=refusal, now=now, tries=tries)


def refused(attempt: int, ranks: Iterable[int], *, refusal: Refusal, now: float, tries: int = 1) -> Refused:
    return Refused(attempt, tuple(sorted(ranks)), refusal, tries, now + retry_after(tries) if refusal.waits else now)
