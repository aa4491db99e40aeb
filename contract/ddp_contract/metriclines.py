"""Metric lines in what a rank prints: training code that already says its loss need not call the
reporter for `kubectl get ddpjobs`, `metrics()` and `plot()` to show it. The runtime scans each rank's
output with these rules (`LineScanner`); the client reads the dask-pytorch-ddp seed's per-step result
files with them (`from_object`).

A line is a metric line when it holds (after any prefix without a brace, such as a logging format's)
a JSON object or a Python dict literal with a numeric `loss` and a step-like (`step`, `global_step`,
`count`, `iteration`) or epoch-like (`epoch`) number, as dask-pytorch-ddp's examples print
`json.dumps({"loss": ..., "epoch": ..., "count": ...})` and Hugging Face's Trainer prints
`{'loss': 0.41, 'grad_norm': 1.9, 'learning_rate': 4.5e-05, 'epoch': 0.5}`. Its other numeric values
are kept as metrics too. A dict literal is read as data, never evaluated (`ast.literal_eval`, and
`nan`/`inf` as floats). Anything else, a line that does not parse, one longer than MAX_LINE and bytes
that are not text included, is passed over without a word: the scan never disturbs the run or its log.
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

# The runtime's own progress line ({"event": "ddp-progress", ...}, on rank 0's output): not the code's.
PROGRESS_EVENT = "ddp-progress"
STEP_KEYS = ("step", "global_step", "count", "iteration")
EPOCH_KEYS = ("epoch",)
LOSS_KEY = "loss"
# Longer lines are not metric lines worth their parsing (and a literal is parsed in time and memory
# bounded by its length).
MAX_LINE = 4096
# A Python literal's words and their JSON spellings, for the fast path (a dict literal of plain
# numbers and quote-free strings is JSON once its quotes and these are swapped).
_PY_WORDS = re.compile(r"\b(True|False|None|nan|inf)\b")
_JSON_WORDS = {"True": "true", "False": "false", "None": "null", "nan": "NaN", "inf": "Infinity"}


class MetricLine(NamedTuple):
    """One recognised line: its loss, step and epoch (either may be missing, not both), and every
    numeric value it holds by its key (loss, step and epoch included). A tuple: one is made for every
    metric line a rank prints."""

    loss: float
    step: int | None
    epoch: float | None
    values: Mapping[str, float]


def parse(line: str) -> MetricLine | None:
    """The metric line `line` is, or None."""
    text = line.rsplit("\r", 1)[-1].strip()  # a progress bar's redrawn line: the last drawing
    start = text.find("{")
    if start < 0 or not text.endswith("}") or len(text) > MAX_LINE or LOSS_KEY not in text:
        return None
    return from_object(_object(text[start:]))


def from_object(found: Any) -> MetricLine | None:
    """The metric line a parsed JSON value is (a dict with a numeric loss and a step or epoch), or None."""
    if not isinstance(found, dict) or found.get("event") == PROGRESS_EVENT:
        return None
    return _metric_line(found)


def _object(text: str) -> Any:
    # A dict literal (single quotes) is tried as JSON in its spelling first: most (plain keys and
    # numbers) are JSON but for their quotes and words, and a failed parse costs more than a swap.
    tries = (_as_json(text), text) if "'" in text else (text, _as_json(text))
    for attempt in tries:
        try:
            return json.loads(attempt)
        except (ValueError, RecursionError):
            pass
    try:
        return ast.literal_eval(_NanInf().visit(ast.parse(text, mode="eval")).body)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def _as_json(text: str) -> str:
    text = text.replace("'", '"')
    if any(word in text for word in _JSON_WORDS):  # cheaper than the pattern where none is (the usual line)
        text = _PY_WORDS.sub(lambda m: _JSON_WORDS[m.group(1)], text)
    return text


class _NanInf(ast.NodeTransformer):
    """`nan` and `inf` (a float's repr) as the floats they name; any other name stays, and fails."""

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in ("nan", "inf"):
            return ast.copy_location(ast.Constant(float(node.id)), node)
        return node


def _metric_line(found: Mapping[Any, Any]) -> MetricLine | None:
    # One pass, types tested directly (which leaves bools out), plain loops: this runs for every
    # metric line a rank prints.
    values = {str(k): float(v) for k, v in found.items() if type(v) is float or type(v) is int}
    loss = values.get(LOSS_KEY)
    if loss is None:
        return None
    step = epoch = None
    for key in STEP_KEYS:
        value = values.get(key)
        if value is not None and math.isfinite(value):
            step = int(value)
            break
    for key in EPOCH_KEYS:
        value = values.get(key)
        if value is not None and math.isfinite(value):
            epoch = value
            break
    if step is None and epoch is None:
        return None
    return MetricLine(loss, step, epoch, values)


class LineScanner:
    """Bytes as a rank writes them in, metric lines out (to `on_line`): whole lines only, each at
    most MAX_LINE long (what a longer one holds up to its end is dropped)."""

    def __init__(self, on_line: Callable[[MetricLine], None]) -> None:
        self.on_line = on_line
        self._partial = b""
        self._skipping = False  # inside a line already longer than MAX_LINE

    def feed(self, data: bytes) -> None:
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for raw in lines:
            if self._skipping:
                self._skipping = False
                continue
            self._scan(raw)
        if len(self._partial) > MAX_LINE:
            self._partial, self._skipping = b"", True

    def _scan(self, raw: bytes) -> None:
        if b"loss" not in raw or b"{" not in raw:  # the common case, at C speed
            return
        found = parse(raw.decode("utf-8", errors="replace"))
        if found is not None:
            self.on_line(found)
