"""The user's code a rank runs: `module:function`, `module`, `script.py` or `script.py:function`,
turned into one callable that takes the rank's context."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import runpy
import sys
import types
from collections.abc import Callable
from typing import Any

from ddp_contract.targets import SCRIPT_FUNCTION_RE

from ..errors import ConfigError
from .context import RankContext


def load_target(target: str) -> Callable[[RankContext], Any]:
    """Turn `module:function`, `module`, `script.py` or `script.py:function` into a callable taking
    the context. A script's folder goes first on sys.path, as `python script.py` puts it, so the
    modules beside it import."""
    script_function = SCRIPT_FUNCTION_RE.match(target)
    if script_function:
        script = _script_on_path(script_function["script"], target)
        module = _import_script(script)
        return _context_callable(getattr(module, script_function["function"], None), target, f"script {script!r}")
    if target.endswith(".py") or os.sep in target:
        script = _script_on_path(target, target)
        return lambda ctx: runpy.run_path(script, run_name="__main__")
    module_name, _, func_name = target.partition(":")
    if not module_name:
        raise ConfigError(f"entrypoint {target!r} is not `module:function`, `module`, a script path or `script.py:function`")
    if not func_name:
        if importlib.util.find_spec(module_name) is None:
            raise ConfigError(f"entrypoint module {module_name!r} cannot be found on sys.path")
        return lambda ctx: runpy.run_module(module_name, run_name="__main__", alter_sys=True)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise ConfigError(f"entrypoint module {module_name!r} cannot be found on sys.path") from exc
        raise
    return _context_callable(getattr(module, func_name, None), target, f"module {module_name!r}")


def _script_on_path(script: str, target: str) -> str:
    if not os.path.isfile(script):
        raise ConfigError(f"entrypoint script {script!r} (of {target!r}) does not exist")
    folder = os.path.dirname(os.path.abspath(script))
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return script


def _import_script(script: str) -> types.ModuleType:
    """The script imported as the module named by its file (registered, so that what it defines can
    be pickled by name, e.g. into spawned DataLoader workers, which find it on sys.path too)."""
    name = os.path.splitext(os.path.basename(script))[0]
    spec = importlib.util.spec_from_file_location(name, script)
    if spec is None or spec.loader is None:
        raise ConfigError(f"entrypoint script {script!r} cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _context_callable(func: Any, target: str, where: str) -> Callable[[RankContext], Any]:
    if not callable(func):
        raise ConfigError(f"entrypoint {target!r}: {where} has no function {target.rpartition(':')[2]!r}")
    positional = [
        p
        for p in inspect.signature(func).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    if len(positional) > 1:
        raise ConfigError(f"entrypoint {target!r} must take no arguments or one (the RankContext)")
    return (lambda ctx: func(ctx)) if positional else (lambda ctx: func())
