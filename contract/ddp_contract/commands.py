"""What a job's `command` is, which the operator and the runtime both judge: the trainer runtime itself,
a launcher that starts the pod's rank processes (torchrun and its kin), or a program that is one rank.

A launcher is never started under another launcher: with ranksPerPod > 1 a program runs under
`torchrun --no-python`, which starts one copy per local rank, while a launcher already starts them (from
the PET_* settings the pod has) and would, wrapped, make each copy a world of its own.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable, Sequence
from typing import Final

RUNTIME: Final = "runtime"
LAUNCHER: Final = "launcher"
PROGRAM: Final = "program"

# The trainer runtime's command in the trainer image (and images built FROM it): `ddp-trainer exec --
# CMD...` runs CMD under it. Its presence is how a pod tells whether its image has the runtime.
RUNTIME_BIN: Final = "/opt/ddp/bin/ddp-trainer"
RUNTIME_MODULE: Final = "ddp_trainer"

# Python modules run with `-m` that start rank processes themselves.
LAUNCHER_MODULES: Final = frozenset({"torch.distributed.run", "torch.distributed.launch", "torchrun",
                                     "accelerate.commands.launch", "deepspeed.launcher.runner"})
# Executables that do, alone or with their first argument.
LAUNCHER_PROGRAMS: Final = frozenset({"torchrun", "accelerate-launch", "deepspeed"})
LAUNCHER_SUBCOMMANDS: Final = {"accelerate": "launch", "lightning": "run", "fabric": "run"}
SHELLS: Final = frozenset({"sh", "bash", "dash", "zsh", "ash", "ksh"})
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
# Python options that take a value as the next argument.
_PYTHON_VALUE_OPTIONS: Final = frozenset({"-W", "-X", "-Q"})
# A launcher or the runtime named inside a shell script's text.
_LAUNCHER_WORDS = re.compile(r"(?<![\w.-])(torchrun|torch\.distributed\.(run|launch)|accelerate(\s+|-)launch|deepspeed"
                             r"|(lightning|fabric)\s+run)(?![\w-])")
_RUNTIME_WORDS = re.compile(r"(?<![\w.-])(ddp-trainer|ddp_trainer)(?![\w-])")

Reader = Callable[[str], str | None]  # a script's path -> its text, or None where it cannot be read


def command_kind(argv: Sequence[str], read: Reader | None = None) -> str:
    """RUNTIME, LAUNCHER or PROGRAM for a command line; `read` (the pod's side) looks into a shell script
    the command runs, which the operator cannot."""
    argv = _without_env(argv)
    if not argv:
        return PROGRAM
    exe = os.path.basename(argv[0])
    if exe == os.path.basename(RUNTIME_BIN):
        return RUNTIME
    if exe in LAUNCHER_PROGRAMS or (exe in LAUNCHER_SUBCOMMANDS and argv[1:2] == [LAUNCHER_SUBCOMMANDS[exe]]):
        return LAUNCHER
    if _PYTHON.match(exe):
        module = _python_module(argv[1:])
        if module == RUNTIME_MODULE:
            return RUNTIME
        return LAUNCHER if module in LAUNCHER_MODULES else PROGRAM
    if exe in SHELLS:
        return _shell_kind(argv[1:], read)
    return PROGRAM


def _without_env(argv: Sequence[str]) -> list[str]:
    """`env [-i] [NAME=value ...] CMD...` -> CMD...; anything else unchanged."""
    args = list(argv)
    if args and os.path.basename(args[0]) == "env":
        args = args[1:]
        while args and (args[0].startswith("-") or "=" in args[0]):
            args = args[1:]
    return args


def _python_module(args: Sequence[str]) -> str | None:
    """The module of `python [options] -m MODULE ...`, None for a script or `-c`."""
    index = 0
    while index < len(args):
        arg = args[index]
        if arg == "-m":
            return args[index + 1] if index + 1 < len(args) else None
        if arg.startswith("-m") and len(arg) > 2:
            return arg[2:]
        if arg in _PYTHON_VALUE_OPTIONS:
            index += 2
            continue
        if not arg.startswith("-") or arg in ("-c", "-"):
            return None
        index += 1
    return None


def _shell_kind(args: Sequence[str], read: Reader | None) -> str:
    """`sh -c 'SCRIPT'` by the script's words, `sh FILE` by the file's where `read` can read it."""
    text: str | None = None
    for index, arg in enumerate(args):
        if arg == "-c" or (arg.startswith("-") and not arg.startswith("--") and "c" in arg[1:]):
            text = args[index + 1] if index + 1 < len(args) else None
            break
        if not arg.startswith("-"):
            text = read(arg) if read is not None else None
            break
    if not text:
        return PROGRAM
    if _LAUNCHER_WORDS.search(text):
        return LAUNCHER
    return RUNTIME if _RUNTIME_WORDS.search(text) else PROGRAM


def describe(argv: Sequence[str]) -> str:
    """The command as a shell would show it, shortened for a message."""
    text = shlex.join(argv)
    return text if len(text) <= 120 else text[:117] + "..."
