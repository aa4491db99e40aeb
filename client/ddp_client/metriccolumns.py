"""Metric records as columns (numpy arrays), each field read from the records once, when first asked for:
a long run has a record per step, and its series, step times, newest steps and attempts' spans are
computed over whole columns. A step is int(record["step"]), a rank int(record.get("rank") or 0); a time
counts where it is a number, a metric's value where it is a finite number that is not a bool."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from functools import cached_property
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from .metricrecords import NOT_METRICS

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
Flags = npt.NDArray[np.bool_]
Indices = npt.NDArray[np.intp]
# A metric against the step: the steps (ascending) and the values.
Curve = tuple[Ints, Floats]


class Columns(Sequence[Mapping[str, Any]]):
    """The records (a sequence of them still) and their fields as arrays: the functions below, given the
    same Columns, read each field once between them."""

    def __init__(self, records: Sequence[Mapping[str, Any]]) -> None:
        self.records = records
        self._raw: dict[str, list[Any]] = {}
        self._metrics: dict[str, tuple[Floats, Flags]] = {}

    @classmethod
    def of(cls, records: Sequence[Mapping[str, Any]]) -> Columns:
        return records if isinstance(records, Columns) else cls(records)

    def __len__(self) -> int:
        return len(self.records)

    @overload
    def __getitem__(self, index: int) -> Mapping[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Mapping[str, Any]]: ...

    def __getitem__(self, index: int | slice) -> Mapping[str, Any] | Sequence[Mapping[str, Any]]:
        return self.records[index]

    def __iter__(self) -> Iterator[Mapping[str, Any]]:
        return iter(self.records)

    def raw(self, name: str) -> list[Any]:
        """Each record's `name` (None where it has none)."""
        if name not in self._raw:
            self._raw[name] = [record.get(name) for record in self.records]
        return self._raw[name]

    def of_rank(self, rank: int | None) -> Indices:
        """The records of `rank` (None: all), in their order."""
        return np.arange(len(self)) if rank is None else np.flatnonzero(self.rank == rank)

    @cached_property
    def rank(self) -> Ints:
        raw = self.raw("rank")
        if set(map(type, raw)) <= {int}:
            return np.array(raw, dtype=np.int64)
        return np.array([int(rank or 0) for rank in raw], dtype=np.int64)

    @cached_property
    def _steps(self) -> tuple[Ints, Flags | None]:
        """The steps, and where int() refused one (None: nowhere): raised only where that record is used."""
        raw = self.raw("step")
        if set(map(type, raw)) <= {int}:
            return np.array(raw, dtype=np.int64), None
        steps, refused = np.zeros(len(raw), dtype=np.int64), np.zeros(len(raw), dtype=np.bool_)
        for index, step in enumerate(raw):
            try:
                steps[index] = int(step)
            except (TypeError, ValueError, OverflowError):
                refused[index] = True
        return steps, refused

    def steps(self, at: Indices) -> Ints:
        """The steps of the records `at`, as int(record["step"]) reads them (its error for the first it refuses)."""
        steps, refused = self._steps
        if refused is not None and refused[at].any():
            step = self.records[int(at[np.argmax(refused[at])])]["step"]
            int(step)  # raises what int() raises for it, else:
            raise OverflowError(f"step {step} is more than a 64-bit integer holds")
        return steps[at]

    @cached_property
    def sort_time(self) -> Floats:
        """float(record.get("time") or 0), what the records are put in time order by."""
        times, timed = self.time
        if timed.all():
            return times
        raw = self.raw("time")
        if set(map(type, raw)) <= {int, float, type(None)}:
            return times  # 0.0 where none
        return np.array([float(when or 0) for when in raw], dtype=np.float64)

    @cached_property
    def time(self) -> tuple[Floats, Flags]:
        """The times as floats, and where a record's time is a number (an int, a bool or a float)."""
        return _numbers(self.raw("time"), finite=False, bools=True)

    @cached_property
    def attempt(self) -> tuple[Ints, Flags]:
        """The attempts, and where a record's attempt is a whole number (an int or a bool)."""
        raw = self.raw("attempt")
        if set(map(type, raw)) <= {int}:
            return np.array(raw, dtype=np.int64), np.ones(len(raw), dtype=np.bool_)
        given = [isinstance(attempt, int) for attempt in raw]
        return (np.array([attempt if ok else 0 for attempt, ok in zip(raw, given, strict=True)], dtype=np.int64),
                np.array(given, dtype=np.bool_))

    @cached_property
    def metric_names(self) -> list[str]:
        return sorted(name for name in set().union(*self.records) if name not in NOT_METRICS)

    def metric(self, name: str) -> tuple[Floats, Flags]:
        """The values of metric `name`, and where one is a finite int or float (not a bool)."""
        if name not in self._metrics:
            self._metrics[name] = _numbers(self.raw(name), finite=True, bools=False)
        return self._metrics[name]


def _numbers(raw: list[Any], finite: bool, bools: bool) -> tuple[Floats, Flags]:
    """Each value as a float (0.0 where it is no number) and where it is a number: an int or a float, a bool
    only where `bools`, a finite one only where `finite`."""
    kinds = set(map(type, raw))
    if kinds <= {int, float, type(None)}:
        values = np.array(raw, dtype=np.float64)  # None: nan
        if finite:
            given = np.isfinite(values)
        elif type(None) in kinds:
            given = np.array([value is not None for value in raw], dtype=np.bool_)
        else:
            given = np.ones(len(raw), dtype=np.bool_)
    else:
        flags = [isinstance(value, int | float) and (bools or not isinstance(value, bool))
                 and (not finite or math.isfinite(value)) for value in raw]
        values = np.array([float(value) if ok else 0.0 for value, ok in zip(raw, flags, strict=True)], dtype=np.float64)
        given = np.array(flags, dtype=np.bool_)
    return np.where(given, values, 0.0), given


def series(columns: Columns, rank: int | None) -> dict[str, Curve]:
    """Each metric against the step for `rank` (None: every rank, averaged per step), as metricrecords.series
    says: of a step a rank logged twice, its latest record by time; a step's values of several ranks added
    in the order their records first came (by time), then divided by their count."""
    chosen, sort_time = columns.of_rank(rank), columns.sort_time  # every record's time read, as sorting all would
    if not len(chosen):
        return {}
    ordered = chosen[np.argsort(sort_time[chosen], kind="stable")]
    steps, ranks = columns.steps(ordered), columns.rank[ordered]
    place = np.lexsort((np.arange(len(ordered)), ranks, steps))  # by step, rank, then time
    starts = np.flatnonzero(np.r_[True, (steps[place][1:] != steps[place][:-1]) | (ranks[place][1:] != ranks[place][:-1])])
    firsts = place[starts]  # each (step, rank)'s first record by time: where its value is added
    lasts = place[np.r_[starts[1:], len(place)] - 1]  # and its latest: the value
    by_step = np.lexsort((firsts, steps[firsts]))
    kept, kept_steps = ordered[lasts[by_step]], steps[firsts[by_step]]
    out: dict[str, Curve] = {}
    for name in columns.metric_names:
        values, given = columns.metric(name)
        present = given[kept]
        if not present.any():
            continue
        logged_steps, logged = kept_steps[present], values[kept[present]]
        if rank is not None:  # a value a step
            out[name] = (logged_steps, logged)
            continue
        new_step = np.r_[True, logged_steps[1:] != logged_steps[:-1]]
        group = np.cumsum(new_step) - 1
        sums = np.bincount(group, weights=logged)  # in index order: each step's running sum, rank after rank
        out[name] = (logged_steps[new_step], sums / np.bincount(group))
    return out


def step_times(columns: Columns, rank: int | None) -> Curve:
    """The steps `rank` (None: any rank) logged with a time, and when each was logged last (at least 0)."""
    times, timed = columns.time
    at = columns.of_rank(rank)
    at = at[timed[at]]
    if not len(at):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
    steps, when = columns.steps(at), np.where(np.isnan(times[at]), 0.0, times[at])  # a NaN time counts as 0
    order = np.lexsort((when, steps))
    steps, when = steps[order], when[order]
    last = np.r_[steps[1:] != steps[:-1], True]
    return steps[last], np.maximum(when[last], 0.0)


def newest(columns: Columns) -> dict[int, int]:
    """Each rank's newest record with a time (the latest one of equal times): rank -> its index, the ranks in
    the order their first timed records came."""
    times, timed = columns.time
    at = np.flatnonzero(timed)
    if not len(at):
        return {}
    order, starts = _runs(columns.rank[at])
    members = at[order]
    when = np.where(np.isnan(times[members]), -np.inf, times[members])
    chosen = members[_last_where(when == _spread(np.maximum.reduceat(when, starts), starts, len(when)), starts)]
    came = np.argsort(members[starts])
    return dict(zip(columns.rank[chosen][came].tolist(), chosen[came].tolist(), strict=True))


def attempt_spans(columns: Columns) -> dict[int, tuple[int, float]]:
    """Each attempt (ascending) of the records with an attempt and a time: the index of its first record by time
    (the earliest of equal times) and its last time."""
    attempts, given = columns.attempt
    times, timed = columns.time
    at = np.flatnonzero(given & timed)
    if not len(at):
        return {}
    order, starts = _runs(attempts[at])
    members = at[order]
    earliest = np.where(np.isnan(times[members]), np.inf, times[members])
    latest = np.where(np.isnan(times[members]), -np.inf, times[members])
    first = members[_first_where(earliest == _spread(np.minimum.reduceat(earliest, starts), starts, len(members)), starts)]
    last = np.maximum.reduceat(latest, starts)
    return dict(zip(attempts[first].tolist(), zip(first.tolist(), last.tolist(), strict=True), strict=True))


def _runs(keys: Ints) -> tuple[Indices, Indices]:
    """The order that puts equal keys together (ascending; each key's in their order), and where each run starts."""
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    return order, np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])


def _spread(per_run: Floats, starts: Indices, count: int) -> Floats:
    """Each run's value at each of its places."""
    return np.repeat(per_run, np.diff(np.r_[starts, count]))


def _first_where(hit: Flags, starts: Indices) -> Indices:
    """Each run's first place where `hit` (every run has one)."""
    places = np.flatnonzero(hit)
    run = np.searchsorted(starts, places, side="right") - 1
    return places[np.r_[True, run[1:] != run[:-1]]]


def _last_where(hit: Flags, starts: Indices) -> Indices:
    """Each run's last place where `hit` (every run has one)."""
    places = np.flatnonzero(hit)
    run = np.searchsorted(starts, places, side="right") - 1
    return places[np.r_[run[1:] != run[:-1], True]]


def find(keys: Ints, wanted: Ints) -> tuple[Indices, Flags]:
    """Where each of `wanted` is in `keys` (ascending, each once), and whether it is there at all."""
    if not len(keys):
        return np.zeros(len(wanted), dtype=np.intp), np.zeros(len(wanted), dtype=np.bool_)
    at = np.minimum(np.searchsorted(keys, wanted), len(keys) - 1)
    return at, keys[at] == wanted
