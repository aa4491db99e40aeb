"""wait()'s progress display: rewritten in place on a terminal and in a notebook, thinned in a file."""

from __future__ import annotations

import io
import sys
import types
from typing import Any

from ddp_client.progressline import ProgressDisplay


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_line_is_rewritten_on_a_terminal_and_thinned_in_a_file(monkeypatch: Any) -> None:
    running = {"phase": "Running", "ready": "2/2"}
    statuses = [{"phase": "Pending"}, running, *({**running, "progress": {"step": s}} for s in (1, 2, 3))]
    file, terminal = io.StringIO(), Terminal()
    for out in (file, terminal):
        display = ProgressDisplay(out)
        for status in statuses:
            display.show(f"{status['phase']} {status.get('progress', {}).get('step', '-')}", status)
        display.end("done")
    # A file: each change of phase and the first progress; more progress only every LINE_SECONDS.
    assert file.getvalue() == "Pending -\nRunning -\nRunning 1\ndone\n"
    assert terminal.getvalue() == "\rPending -\rRunning -\rRunning 1\rRunning 2\rRunning 3\r         \rdone\n"
    monkeypatch.setattr("ddp_client.progressline.LINE_SECONDS", 0.0)
    display = ProgressDisplay(file := io.StringIO())
    for status in statuses:
        display.show(f"{status['phase']} {status.get('progress', {}).get('step', '-')}", status)
    assert file.getvalue().splitlines()[-1] == "Running 3"


def test_in_a_notebook_the_line_is_rewritten_too(monkeypatch: Any) -> None:
    monkeypatch.setitem(sys.modules, "ipykernel", types.ModuleType("ipykernel"))
    display = ProgressDisplay(out := io.StringIO())
    display.show("a", {"phase": "Pending"})
    display.show("b", {"phase": "Pending"})
    assert out.getvalue() == "\ra\rb"
