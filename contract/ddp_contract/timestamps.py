"""Times as Kubernetes and the DDPJob status write them: RFC 3339, UTC, with a Z."""

from __future__ import annotations

from datetime import UTC, datetime


def rfc3339(moment: datetime | float, millis: bool = False) -> str:
    """`2026-01-02T03:04:05Z` (or `...05.123Z`) for a datetime or a POSIX timestamp; naive means UTC."""
    if not isinstance(moment, datetime):
        moment = datetime.fromtimestamp(moment, tz=UTC)
    elif moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    text = moment.astimezone(UTC).isoformat(timespec="milliseconds" if millis else "seconds")
    return text.replace("+00:00", "Z")


def parse_rfc3339(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))
