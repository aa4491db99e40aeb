"""The per-rank JSON lines of `log_metrics` as records, and as series of a metric against the step.

A rank's records come from one source, the best it has: its code's `log_metrics`; else the per-step
result files of dask-pytorch-ddp's results layout (`results/worker/<rank>/*.json`, each the dict its
workers submit); else the metric lines it printed (`"source": "printed"`, made by the runtime).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from ddp_contract.metriclines import from_object

# Fields every record has that are not metrics.
NOT_METRICS = frozenset({"step", "epoch", "time", "rank", "source", "attempt"})
# dask-pytorch-ddp's result files: results/<DASK_WORKER_FOLDER>/<rank>/<name>.json.
DASK_WORKER_FOLDER = "worker"
PRINTED = "printed"  # the runtime's records of printed metric lines
DASK_RESULTS = "seed-results"  # the source of records read from dask-pytorch-ddp's result files
# The sources, best first.
SOURCES = (None, DASK_RESULTS, PRINTED)

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


def dask_result_record(key: str, body: bytes, order: int) -> Record | None:
    """A record of one of dask-pytorch-ddp's result files (key relative to the job's results: worker/<rank>/...),
    `order` its place among them (the files are named by time); None for a file that is not a metric dict."""
    parts = key.split("/")
    if len(parts) < 3 or parts[0] != DASK_WORKER_FOLDER or not parts[1].isdigit():
        return None
    try:
        line = from_object(json.loads(body))
    except (ValueError, RecursionError):
        return None
    if line is None:
        return None
    extra = {k: v for k, v in line.values.items() if k not in NOT_METRICS and k != "loss"}
    return {**extra, "step": line.step if line.step is not None else order, "epoch": line.epoch, "loss": line.loss,
            "rank": int(parts[1]), "time": float(order), "source": DASK_RESULTS}


def best_sources(records: Iterable[Record]) -> list[Record]:
    """Each rank's records from its best source only (SOURCES), so a plot never doubles a step."""
    by_rank: dict[int, dict[Any, list[Record]]] = {}
    for record in records:
        by_rank.setdefault(int(record.get("rank") or 0), {}).setdefault(record.get("source"), []).append(record)
    kept: list[Record] = []
    for sources in by_rank.values():
        best = min(sources, key=lambda s: SOURCES.index(s) if s in SOURCES else -1)
        kept.extend(sources[best])
    return kept


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
