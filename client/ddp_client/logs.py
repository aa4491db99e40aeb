"""Ranks' output merged into one text: every line prefixed `[rank N] `, the failed rank first."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ddp_contract.resource import JobStatus


def prefix_lines(rank: int, text: str) -> str:
    """Each line of `text` with `[rank N] ` in front (a last line without a newline gets one)."""
    if not text:
        return ""
    lines = text.splitlines()
    return "".join(f"[rank {rank}] {line}\n" for line in lines)


def rank_order(ranks: Iterable[int], failed: int | None = None) -> list[int]:
    """Ranks ascending, the failed rank (when there is one among them) first."""
    ordered = sorted(set(ranks))
    if failed is not None and failed in ordered:
        ordered.remove(failed)
        ordered.insert(0, failed)
    return ordered


def failed_rank(status: Mapping[str, Any], attempt: int | None) -> int | None:
    """The rank whose failure ended `attempt` (the job's status.failedRank), if that attempt's failure is the one recorded."""
    failed = JobStatus.of(status).failed_rank or {}
    if failed.get("rank") is None or failed.get("attempt") not in (None, attempt):
        return None
    return int(failed["rank"])


def merge(texts: Mapping[int, str], failed: int | None = None) -> str:
    """Every rank's whole output, one rank after another, each line prefixed."""
    return "".join(prefix_lines(rank, texts[rank]) for rank in rank_order(texts, failed))


class Follower:
    """For `logs --follow`: given each rank's whole output so far, again and again, returns only the
    complete lines not returned before (a line still being written waits for its newline)."""

    def __init__(self) -> None:
        self._sent: dict[int, int] = {}

    def new_lines(self, texts: Mapping[int, str], failed: int | None = None, final: bool = False) -> str:
        out = []
        for rank in rank_order(texts, failed):
            text = texts[rank]
            start = self._sent.get(rank, 0)
            if len(text) < start:  # a new attempt's output replaced the last one: start again
                start = 0
            end = len(text) if final else text.rfind("\n", start) + 1
            if end > start:
                out.append(prefix_lines(rank, text[start:end]))
                self._sent[rank] = end
        return "".join(out)
