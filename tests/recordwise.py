"""The dashboard's curves and marks worked out a record at a time, in plain Python: the definition that
ddp_client's column code (metriccolumns, downsample, web/views) is tested against, result for result.

A sum here is a running sum from the first value to the last, as numpy's bincount adds (Python 3.12's
sum() of floats compensates its rounding, and would differ in the last bit)."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

NOT_METRICS = frozenset({"step", "epoch", "time", "rank", "source", "attempt"})
Point = tuple[float, float]


def running_sum(values: Iterable[float]) -> float:
    total = 0.0
    for value in values:
        total += value
    return total


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def series(records: Iterable[Mapping[str, Any]], rank: int | None = 0) -> dict[str, list[tuple[int, float]]]:
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
    return {name: [(step, running_sum(values) / len(values)) for step, values in sorted(by_step.items())]
            for name, by_step in sorted(sums.items())}


def largest_triangles(points: Sequence[Point], limit: int) -> list[Point]:
    if len(points) <= limit:
        return list(points)
    kept = [points[0]]
    width = (len(points) - 2) / (limit - 2)
    previous = points[0]
    for bucket in range(limit - 2):
        start, end = int(bucket * width) + 1, int((bucket + 1) * width) + 1
        following = points[end:min(int((bucket + 2) * width) + 1, len(points) - 1)] or [points[-1]]
        mean_x = running_sum(float(x) for x, _ in following) / len(following)
        mean_y = running_sum(float(y) for _, y in following) / len(following)
        best = max(points[start:end], key=lambda p: abs((previous[0] - mean_x) * (p[1] - previous[1])
                                                        - (previous[0] - p[0]) * (mean_y - previous[1])))
        kept.append(best)
        previous = best
    kept.append(points[-1])
    return kept


def step_times(records: Iterable[Mapping[str, Any]], rank: int | None) -> dict[int, float]:
    when: dict[int, float] = {}
    for record in records:
        if (rank is None or int(record.get("rank") or 0) == rank) and isinstance(record.get("time"), int | float):
            when[int(record["step"])] = max(when.get(int(record["step"]), 0.0), float(record["time"]))
    return when


def curves(records: Sequence[Mapping[str, Any]], rank: int | None, axis: str, points: int) -> dict[str, Any]:
    drawn_series = series(records, rank)
    when = step_times(records, rank) if axis == "time" else {}
    out = {}
    for name, values in drawn_series.items():
        placed = [(when[step], y) for step, y in values if step in when] if axis == "time" else \
            [(float(step), y) for step, y in values]
        drawn = largest_triangles(placed, points)
        out[name] = {"x": [x for x, _ in drawn], "y": [y for _, y in drawn], "points": len(values)}
    return out


def curves_by_rank(records: Sequence[Mapping[str, Any]], most_ranks: int, points: int) -> dict[str, Any]:
    ranks = sorted({int(r.get("rank") or 0) for r in records})[:most_ranks]
    by_rank = {rank: series(records, rank) for rank in ranks}
    out: dict[str, Any] = {}
    for name in sorted({name for drawn in by_rank.values() for name in drawn}):
        values = {rank: dict(drawn.get(name, [])) for rank, drawn in by_rank.items()}
        steps = sorted({step for logged in values.values() for step in logged})
        if len(steps) > points:
            stride = len(steps) / points
            steps = [steps[int(i * stride)] for i in range(points - 1)] + [steps[-1]]
        out[name] = {"x": steps, "ys": {str(rank): [logged.get(step) for step in steps] for rank, logged in values.items()},
                     "points": max(len(logged) for logged in values.values())}
    return out


def last_steps(records: Iterable[Mapping[str, Any]]) -> dict[int, dict[str, Any]]:
    newest: dict[int, dict[str, Any]] = {}
    for record in records:
        rank, when = int(record.get("rank") or 0), record.get("time")
        if isinstance(when, int | float) and (rank not in newest or when >= newest[rank]["time"]):
            newest[rank] = {"step": int(record["step"]), "time": float(when)}
    return newest


def attempt_starts(records: Iterable[Mapping[str, Any]]) -> list[tuple[int, Any, Any]]:
    """(attempt, its first record's time, that record's step) of each attempt after the first."""
    spans: dict[int, list[Any]] = {}  # attempt -> [first time, last time, first step]
    for record in records:
        attempt, when = record.get("attempt"), record.get("time")
        if not isinstance(attempt, int) or not isinstance(when, int | float):
            continue
        span = spans.setdefault(attempt, [when, when, record["step"]])
        if when < span[0]:
            span[0], span[2] = when, record["step"]
        span[1] = max(span[1], when)
    return [(attempt, spans[attempt][0], spans[attempt][2]) for attempt in sorted(spans)[1:]]


def messy_records(seed: int, count: int, ranks: int = 4) -> list[dict[str, Any]]:
    """Records of a run that restarted: ranks that logged different steps (gaps), resumed attempts that
    logged steps again later, equal and int times, records without a time, metrics some records lack,
    and values that are no numbers (None, text, a bool, NaN, infinity)."""
    rng = random.Random(seed)
    records = []
    when = 1_800_000_000.0
    for _ in range(count):
        when += rng.choice([0.0, 0.5, 1.0, 2.0, -3.0])
        record: dict[str, Any] = {"step": rng.randint(0, count // 2), "epoch": 0, "rank": rng.randrange(ranks),
                                  "attempt": rng.randint(0, 3), "time": rng.choice([when, when, int(when)])}
        if rng.random() < 0.9:
            record["loss"] = rng.random() * 10
            if rng.random() < 0.1:
                record["loss"] = rng.choice([rng.randint(-5, 5), None, "x", True, math.nan, math.inf])
        if rng.random() < 0.5:
            record["accuracy"] = rng.random()
        if rng.random() < 0.05:
            record["note"] = "text"
        if rng.random() < 0.05:
            record["rank"] = None  # rank 0
        if rng.random() < 0.03:
            del record["time"]
        records.append(record)
    return records
