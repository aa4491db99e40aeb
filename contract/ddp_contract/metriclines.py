"""Metric lines and progress bars in what a rank prints: training code that already says its loss
need not call the reporter for `kubectl get ddpjobs`, `metrics()` and `plot()` to show it. The runtime
scans each rank's output with these rules (`LineScanner`); the client reads the dask-pytorch-ddp
example's per-step result files with them (`from_object`).

A line is a metric line when it holds (after any prefix without a brace, such as a logging format's)
a JSON object or a Python dict literal with a numeric `loss` and a step-like (`step`, `global_step`,
`count`, `iteration`) or epoch-like (`epoch`) number, as dask-pytorch-ddp's examples print
`json.dumps({"loss": ..., "epoch": ..., "count": ...})` and Hugging Face's Trainer prints
`{'loss': 0.41, 'grad_norm': 1.9, 'learning_rate': 4.5e-05, 'epoch': 0.5}` (transformers 4) or
`{'loss': '0.41', 'grad_norm': '1.9', 'learning_rate': '4.5e-05', 'epoch': '0.5'}` (transformers 5: a
number may be a string holding one). Its other numeric values are kept as metrics too. A dict literal
is read as data, never evaluated (`ast.literal_eval`, and `nan`/`inf` as floats).

A progress bar is what tqdm draws (Hugging Face's and Lightning's bars, plain loops'), each update
after a carriage return: `desc: 45%|####5     | 45/100 [00:12<00:15,  3.61it/s, loss=0.123]`, or
without a total `desc: 45it [00:12,  3.61it/s]`; and Lightning's rich bar,
`Epoch 3/9 ━━━━━━━━━━ 16/32 0:00:04 • 0:00:04 4.02it/s train_loss: 0.345`. Terminal escapes (a nested
bar's cursor moves) are dropped first.

Anything else, a line that does not parse, one longer than MAX_LINE and bytes that are not text
included, is passed over without a word: the scan never disturbs the run or its log.
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
# A string that holds a number, as Python formats one ('0.41', '4.5e-05', '1', 'nan', '-inf').
_NUMBER = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?$|^[-+]?(?i:nan|inf|infinity)$")
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
    if len(values) < len(found):  # transformers 5 formats its numbers as strings
        values.update({str(k): float(v) for k, v in found.items() if type(v) is str and _NUMBER.match(v)})
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


class ProgressBar(NamedTuple):
    """One drawing of a progress bar: its description, how far (n of total; total None where the bar
    does not know it), its elapsed and remaining seconds as it says them, and the numbers of its
    postfix (`loss=0.123`, `train_loss: 0.345`)."""

    desc: str
    n: float
    total: float | None
    elapsed_s: float | None
    remaining_s: float | None
    values: Mapping[str, float]
    rich: bool = False  # Lightning's rich bar, whose "Epoch 3/9" counts epochs from 0 to the last one

    @property
    def fraction(self) -> float | None:
        return min(1.0, self.n / self.total) if self.total else None


_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_UNITS = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_COUNT = r"\d+(?:\.\d+)?[kMGT]?"
_CLOCK = r"(?:\d+:)?\d+:\d+"
# tqdm's default bar_format, and its form without a total; the rate is `3.61it/s`, `1.2s/it`, `?it/s`
# or another unit's.
_TQDM = re.compile(
    rf"^(?:(?P<desc>.*?):\s*)?(?:(?P<pct>\d{{1,3}})%)?\|[^|]*\|\s*(?P<n>{_COUNT})/(?P<total>{_COUNT}|\?)\s*"
    rf"\[(?P<elapsed>{_CLOCK})<(?P<remaining>{_CLOCK}|\?),\s*[^,\]]*(?:,\s*(?P<postfix>[^\]]*))?\]\s*$")
_TQDM_UNKNOWN = re.compile(
    rf"^(?:(?P<desc>.*?):\s*)?(?P<n>{_COUNT})\s*[^\s\[]*\s*\[(?P<elapsed>{_CLOCK}),\s*[^,\]]*"
    rf"(?:,\s*(?P<postfix>[^\]]*))?\]\s*$")
_RICH = re.compile(
    rf"^(?P<desc>.*?)\s*[\u2501\u2578\u257a\u2500 ]+\s*(?P<n>\d+)/(?P<total>\d+)\s+(?P<elapsed>{_CLOCK})"
    rf"(?:\s*\u2022\s*(?P<remaining>{_CLOCK}|-:--:--)?)?\s*(?:[\d.]+\s*\S*/s)?(?P<postfix>.*)$")
_POSTFIX = re.compile(r"([A-Za-z_][\w./-]*)\s*[=:]\s*([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|nan|inf)(?![\w.])")


def parse_bar(text: str) -> ProgressBar | None:
    """The progress bar one drawing `text` is, or None."""
    text = _ESCAPE.sub("", text).strip()
    if not text or len(text) > MAX_LINE:
        return None
    found = _TQDM.match(text)
    if found:
        total = None if found["total"] == "?" else _count(found["total"])
        return ProgressBar(found["desc"] or "", _count(found["n"]), total or None, _seconds(found["elapsed"]),
                           _seconds(found["remaining"]), _postfix(found["postfix"]))
    found = _RICH.match(text) if "\u2501" in text or "\u2500" in text else None
    if found:
        return ProgressBar(found["desc"].strip(), float(found["n"]), float(found["total"]) or None,
                           _seconds(found["elapsed"]), _seconds(found["remaining"]), _postfix(found["postfix"]),
                           rich=True)
    found = _TQDM_UNKNOWN.match(text)
    if found:
        return ProgressBar(found["desc"] or "", _count(found["n"]), None, _seconds(found["elapsed"]), None,
                           _postfix(found["postfix"]))
    return None


def _count(text: str) -> float:
    unit = text[-1] if text[-1] in _UNITS else ""
    return float(text[:len(text) - len(unit)]) * _UNITS[unit]


def _seconds(text: str | None) -> float | None:
    if not text or not text[0].isdigit():
        return None
    seconds = 0.0
    for part in text.split(":"):
        seconds = seconds * 60 + float(part)
    return seconds


def _postfix(text: str | None) -> dict[str, float]:
    return {key: float(value) for key, value in _POSTFIX.findall(text or "")}


class LineScanner:
    """Bytes as a rank writes them in, metric lines (to `on_line`) and progress bars (to `on_bar`) out.
    A line ends at a newline or a carriage return (a bar's redrawing), each at most MAX_LINE long (what
    a longer one holds up to its end is dropped). A bar's drawing is read as soon as it is whole (it
    ends in `]`, or is a rich bar), before the next drawing ends it."""

    def __init__(self, on_line: Callable[[MetricLine], None],
                 on_bar: Callable[[ProgressBar], None] | None = None) -> None:
        self.on_line = on_line
        self.on_bar = on_bar
        self._partial = b""
        self._skipping = False  # inside a line already longer than MAX_LINE
        self._seen = b""  # the partial line already read as a bar

    def feed(self, data: bytes) -> None:
        if not self._partial and not self._skipping and data.endswith(b"\n") and b"{" not in data and b"/" not in data:
            return  # whole lines that hold neither a metric line nor a bar: the common case, at C speed
        data = self._partial + data
        if b"\r" in data:
            data = data.replace(b"\r", b"\n")
        lines = data.split(b"\n")
        self._partial = lines.pop()
        for raw in lines:
            if self._skipping:
                self._skipping = False
                continue
            if raw != self._seen:
                self._scan(raw)
            self._seen = b""
        if len(self._partial) > MAX_LINE:
            self._partial, self._skipping = b"", True
        elif self.on_bar is not None and self._partial.endswith(b"]") and self._partial != self._seen:
            self._seen = self._partial
            self._scan_bar(self._partial)

    def _scan(self, raw: bytes) -> None:
        if b"{" in raw and b"loss" in raw:  # `in` tests at C speed: most lines are neither
            found = parse(raw.decode("utf-8", errors="replace"))
            if found is not None:
                self.on_line(found)
                return
        if self.on_bar is not None and b"/" in raw and (b"|" in raw or b"/s" in raw or b"s/" in raw):
            self._scan_bar(raw)

    def _scan_bar(self, raw: bytes) -> None:
        assert self.on_bar is not None
        bar = parse_bar(raw.decode("utf-8", errors="replace"))
        if bar is not None:
            self.on_bar(bar)
