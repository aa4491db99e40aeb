"""A DDPJob as the API server returns it, read through typed views (kopf's bodies are the model):
`JobRef` names the job, `JobStatus` reads the status fields the operator, the runtime and the client
share. A missing or malformed field reads as its default (a job's status is written by several hands
over its life), so a reader never spells a key or guards a type itself."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .api import members_of
from .jobstatus import (
    STATUS_ATTEMPT,
    STATUS_ATTEMPT_CAUSE,
    STATUS_ATTEMPT_TIME,
    STATUS_CHECKPOINT_REQUESTED,
    STATUS_COMPLETION_TIME,
    STATUS_CONDITIONS,
    STATUS_FAILED_RANK,
    STATUS_LAST_CHECKPOINT,
    STATUS_MEMBERS,
    STATUS_MESSAGE,
    STATUS_PHASE,
    STATUS_PROCESS_FAILURES,
    STATUS_REASON,
    STATUS_RECREATED_ATTEMPT,
    STATUS_RENDEZVOUS,
    STATUS_RESTARTS,
    STATUS_START_TIME,
)

JobKey = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True)
class JobRef:
    """Which job: its namespace, name and uid (the metadata's)."""

    namespace: str
    name: str
    uid: str = ""

    @classmethod
    def of(cls, job: Mapping[str, Any]) -> JobRef:
        meta = job.get("metadata") or {}
        return cls(str(meta.get("namespace") or ""), str(meta.get("name") or ""), str(meta.get("uid") or ""))

    @property
    def key(self) -> JobKey:
        return (self.namespace, self.name)


def job_key(job: Mapping[str, Any]) -> JobKey:
    """(namespace, name) of a job as the API returns it."""
    return JobRef.of(job).key


@dataclass(frozen=True)
class JobStatus:
    """A job's status, read."""

    raw: Mapping[str, Any]

    @classmethod
    def of(cls, status: Mapping[str, Any] | None) -> JobStatus:
        return cls(status or {})

    @classmethod
    def of_job(cls, job: Mapping[str, Any]) -> JobStatus:
        return cls(job.get("status") or {})

    @property
    def phase(self) -> str | None:
        phase = self.raw.get(STATUS_PHASE)
        return phase if isinstance(phase, str) and phase else None

    @property
    def reason(self) -> str:
        return _text(self.raw.get(STATUS_REASON)) or ""

    @property
    def message(self) -> str:
        return _text(self.raw.get(STATUS_MESSAGE)) or ""

    @property
    def start_time(self) -> str | None:
        return _text(self.raw.get(STATUS_START_TIME))

    @property
    def completion_time(self) -> str | None:
        return _text(self.raw.get(STATUS_COMPLETION_TIME))

    @property
    def attempt_time(self) -> str | None:
        return _text(self.raw.get(STATUS_ATTEMPT_TIME))

    def condition(self, kind: str) -> Mapping[str, Any] | None:
        """The condition of type `kind`, if the status has one."""
        conditions = self.raw.get(STATUS_CONDITIONS)
        for found in conditions if isinstance(conditions, list) else ():
            if isinstance(found, Mapping) and found.get("type") == kind:
                return found
        return None

    def count(self, field: str) -> int:
        """A counter field (restarts, programRestarts, ...): 0 where absent or malformed."""
        return _count(self.raw.get(field)) or 0

    @property
    def gang_reported(self) -> bool:
        """Whether rank 0 has recorded any gang forming (status.rendezvous)."""
        return bool(self.raw.get(STATUS_RENDEZVOUS))

    @property
    def checkpoint_requested(self) -> object:
        """status.checkpointRequested as written (an elastic grow reads it)."""
        return self.raw.get(STATUS_CHECKPOINT_REQUESTED)

    @property
    def process_failures(self) -> Mapping[str, Any] | None:
        found = self.raw.get(STATUS_PROCESS_FAILURES)
        return found if isinstance(found, Mapping) else None

    @property
    def attempt(self) -> int:
        return _count(self.raw.get(STATUS_ATTEMPT)) or 0

    @property
    def recreated_attempt(self) -> int | None:
        return _count(self.raw.get(STATUS_RECREATED_ATTEMPT))

    @property
    def formed_attempt(self) -> int | None:
        """The last attempt whose gang formed (status.rendezvous.attempt)."""
        return _count(_field(self.raw, STATUS_RENDEZVOUS, STATUS_ATTEMPT))

    @property
    def gang_formed(self) -> bool:
        """Whether rank 0 recorded the current attempt's gang forming."""
        formed = self.formed_attempt
        return formed is not None and formed >= self.attempt

    @property
    def members(self) -> tuple[int, ...] | None:
        """status.members: an elastic job's gang, pod indices in rank order."""
        return members_of(self.raw.get(STATUS_MEMBERS))

    @property
    def checkpoint_uri(self) -> str | None:
        uri = _field(self.raw, STATUS_LAST_CHECKPOINT, "uri")
        return uri if isinstance(uri, str) and uri else None

    @property
    def checkpoint_step(self) -> int | None:
        return _count(_field(self.raw, STATUS_LAST_CHECKPOINT, "step"))

    @property
    def checkpoint_requested_since(self) -> str | None:
        since = _field(self.raw, STATUS_CHECKPOINT_REQUESTED, "since")
        return since if isinstance(since, str) and since else None

    @property
    def restarts(self) -> int:
        return _count(self.raw.get(STATUS_RESTARTS)) or 0

    @property
    def failed_rank(self) -> Mapping[str, Any] | None:
        found = self.raw.get(STATUS_FAILED_RANK)
        return found if isinstance(found, Mapping) else None

    def attempt_cause(self, attempt: int) -> Mapping[str, Any] | None:
        """Why `attempt` began (a gang restart or a resize), while the status still says it."""
        found = self.raw.get(STATUS_ATTEMPT_CAUSE)
        return found if isinstance(found, Mapping) and found.get(STATUS_ATTEMPT) == attempt else None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _field(status: Mapping[str, Any], name: str, key: str) -> object:
    value = status.get(name)
    return value.get(key) if isinstance(value, Mapping) else None


def _count(value: object) -> int | None:
    """A non-negative integer field; None where it is absent or anything else (a bool, a string)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value
