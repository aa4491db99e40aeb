"""Python imports this module at start-up in every process of a command the trainer runtime runs: its
folder leads the command's PYTHONPATH (runtime/command.py). It installs ddp_trainer.runtime.inprocess,
then runs the sitecustomize this one hides (Debian's Python has one), as Python would have."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys


def _next_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    path = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


try:
    from ddp_trainer.runtime import inprocess

    inprocess.install()
except Exception as error:  # noqa: BLE001 - the user's program runs as it is without the hook
    print(f"ddp-trainer: the runtime's in-process hook is off: {error}", file=sys.stderr)
try:
    _next_sitecustomize()
except Exception as error:  # noqa: BLE001 - as Python itself reports a failing sitecustomize
    print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(error).__name__}: {error}", file=sys.stderr)
