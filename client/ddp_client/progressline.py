"""wait()'s progress display: one line rewritten in place on a terminal and in a Jupyter notebook; in
a file (a CI log) a line per change, progress alone at most every LINE_SECONDS."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import IO, Any

from ddp_contract.jobstatus import STATUS_PHASE, STATUS_PROGRESS, STATUS_READY, STATUS_REASON, STATUS_RESTARTS

LINE_SECONDS = 30.0  # outside a terminal or notebook, progress alone prints a line this often


def in_notebook() -> bool:
    """Output goes to a Jupyter kernel, whose output area rewrites a line after a carriage return."""
    return "ipykernel" in sys.modules


class ProgressDisplay:
    """wait()'s progress line: rewritten in place on a terminal and in a notebook; elsewhere (a file,
    a CI log) a line when the phase, readiness, restarts or reason change and at the first progress,
    then progress at most every LINE_SECONDS."""

    def __init__(self, out: IO[str] | None) -> None:
        self.out = out
        self.in_place = out is not None and (out.isatty() or in_notebook())
        self.shown = ""
        self.state: tuple[Any, ...] | None = None
        self.printed_at = 0.0

    def show(self, line: str, status: Mapping[str, Any]) -> None:
        if self.out is None or line == self.shown:
            return
        if self.in_place:
            self.out.write("\r" + line.ljust(len(self.shown)))
        else:
            state = (status.get(STATUS_PHASE), status.get(STATUS_READY), status.get(STATUS_RESTARTS),
                     status.get(STATUS_REASON), bool(status.get(STATUS_PROGRESS)))
            if state == self.state and time.monotonic() - self.printed_at < LINE_SECONDS:
                return
            self.out.write(line + "\n")
            self.state, self.printed_at = state, time.monotonic()
        self.shown = line
        self.out.flush()

    def end(self, outcome: str) -> None:
        if self.out is None:
            return
        if self.in_place and self.shown:
            self.out.write("\r" + " " * len(self.shown) + "\r")
        print(outcome, file=self.out, flush=True)
