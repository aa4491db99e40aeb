"""The per-rank JSON lines of `log_metrics` as records, and as series of a metric against the step.

A rank's records come from one source, the best it has: its code's `log_metrics`; else the per-step
result files of dask-pytorch-ddp's results layout (`results/worker/<rank>/*.json`, each the dict its
workers submit); else the metric lines it printed (`"source": "printed"`, made by the runtime).
"""

from __future__ import annotations

import gc
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
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


def parse_lines(text: str | bytes, where: str = "metrics") -> list[Record]:
    """Records of one JSON-lines object; a line that is not a JSON object is an error naming it."""
    with _no_cycle_collection():
        records = _parse_at_once(text)
        return records if records is not None else _parse_each(text if isinstance(text, str) else text.decode(), where)


@contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """Python's cycle collector off meanwhile: a long run's records are hundreds of thousands of new dicts, whose
    allocation sets it off again and again to walk every object of the process (nearly half the time of
    reading them in the dashboard's process), and they hold no reference cycles for it to find."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _parse_at_once(text: str | bytes) -> list[Record] | None:
    """The records of every line, parsed as the items of one JSON array (a long run's lines in half the
    time of a json.loads each); None unless that gives as many metrics records as the text has lines.
    Only for ASCII lines that end in newlines: other line ends (a carriage return, U+2028) end a line
    for _parse_each, but are whitespace, or part of a string, to the parser."""
    body = (text.encode() if isinstance(text, str) else text).strip()
    if not body:
        return []
    if not body.isascii() or b"\r" in body:
        return None
    records = _array(b"[" + body.replace(b"\n", b",") + b"]")
    # A line of two records, or of part of one, makes the count differ.
    if records is None or len(records) != body.count(b"\n") + 1 or \
            not all(isinstance(r, dict) and "step" in r for r in records):
        return None
    return records


def _array(data: bytes) -> list[Any] | None:
    """A JSON array, or None if it is no JSON array."""
    try:
        parsed = json.loads(data)
    except (ValueError, RecursionError):  # a blank line, or a line that is no record: named line by line
        return None
    return parsed if isinstance(parsed, list) else None


def _parse_each(text: str, where: str) -> list[Record]:
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
    """Each rank's records from its best source only (SOURCES), so a plot never doubles a step; grouped by rank,
    in the order each rank first came."""
    records = records if isinstance(records, list) else list(records)
    if _one_source_by_rank(records):  # a long run's usual case: its ranks' metrics files, one after another
        return records
    by_rank: dict[int, dict[Any, list[Record]]] = {}
    for record in records:
        by_rank.setdefault(int(record.get("rank") or 0), {}).setdefault(record.get("source"), []).append(record)
    kept: list[Record] = []
    for sources in by_rank.values():
        best = min(sources, key=lambda s: SOURCES.index(s) if s in SOURCES else -1)
        kept.extend(sources[best])
    return kept


def _one_source_by_rank(records: list[Record]) -> bool:
    """Whether every record has the same source and each rank's records come together: best_sources would
    keep them all, in their order. Two passes over the records instead of grouping them."""
    if len({record.get("source") for record in records}) > 1:
        return False
    ranks = [record.get("rank") for record in records]
    distinct = {int(rank or 0) for rank in ranks}
    if len(set(ranks)) != len(distinct):  # one rank written two ways (0 and None): compared as ints below
        return False
    changes = sum(1 for before, after in zip(ranks, ranks[1:], strict=False) if before != after)
    return changes < len(distinct)


def series(records: Iterable[Mapping[str, Any]], rank: int | None = 0) -> Series:
    """Each numeric metric against the step, for one rank (None: every rank, averaged per step).
    A step logged twice (a restarted gang that resumed before it) keeps its latest record."""
    from . import metriccolumns

    columns = metriccolumns.Columns(records if isinstance(records, Sequence) else list(records))
    return {name: list(zip(steps.tolist(), values.tolist(), strict=True))
            for name, (steps, values) in metriccolumns.series(columns, rank).items()}
