"""The per-rank JSON lines of `log_metrics` as records, and as series of a metric against the step."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

# Fields every record has that are not metrics.
NOT_METRICS = frozenset({"step", "epoch", "time", "rank"})

Record = dict[str, Any]
Series = dict[str, list[tuple[int, float]]]


def parse_lines(text: str, where: str = "metrics") -> list[Record]:
    """Records of one JSON-lines object; a line that is not a JSON object is an error naming it."""
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where} line {number} is not JSON: {error}: {line[:200]!r}") from None
        if not isinstance(record, dict) or "step" not in record:
            raise ValueError(f"{where} line {number} is not a metrics record (an object with a step): {line[:200]!r}")
        records.append(record)
    return records


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def series(records: Iterable[Mapping[str, Any]], rank: int | None = 0) -> Series:
    """Each numeric metric against the step, for one rank (None: every rank, averaged per step).
    A step logged twice (a restarted gang that resumed before it) keeps its latest record."""
    latest: dict[tuple[int, int], Mapping[str, Any]] = {}
    for record in sorted(records, key=lambda r: float(r.get("time") or 0)):
        record_rank = int(record.get("rank") or 0)
        if rank is None or record_rank == rank:
            latest[(int(record["step"]), record_rank)] = record
    sums: dict[str, dict[int, list[float]]] = {}
    for (step, _), record in latest.items():
        for name, value in record.items():
            number = _number(value)
            if name not in NOT_METRICS and number is not None:
                sums.setdefault(name, {}).setdefault(step, []).append(number)
    return {name: [(step, sum(values) / len(values)) for step, values in sorted(by_step.items())]
            for name, by_step in sorted(sums.items())}
