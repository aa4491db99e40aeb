"""What the trainer runtime adds inside each Python process of a job's command (`ddp-trainer exec`):
hook/sitecustomize.py, first on the command's PYTHONPATH, installs it, so the user's code is unchanged.

- A process group of another size than the job's gang fails at once, saying why. A launcher inside a
  launcher, torchrun flags or `init_process_group(world_size=...)` that do not match the job, and a
  script that trains alone in each pod would otherwise each train a model of their own, and succeed.
- Global rank 0 says when its process group formed (envnames.FORMED_FILE); the pod's runtime writes
  that into the job's status.rendezvous.
- An uncaught exception leaves its failure line in envnames.FAILURE_DIR with the exit code it means (a
  broken collective is the infrastructure's, not the program's), which the pod's runtime reports for
  the pod where a launcher reports only an exit 1 of its own.
- SIGUSR1 prints every thread's stack (faulthandler), for the runtime's hang watch.
- A Hugging Face or Lightning trainer on global rank 0 says how far it is (step of how many, epoch,
  loss) on envnames.PROGRESS_SOCKET, through a callback added to it as it is made: a Lightning bar draws
  nothing live where its output is no terminal (rich), or is turned off, and a tqdm bar's epoch does not
  say how many epochs there are. It says so at most every PROBE_INTERVAL_S, and always at the end of
  training (its last step). An entrypoint's rank 0 process watches its trainers the same way
  (`watch_trainers`, called by runtime/entrypoint.py), its messages going straight to its tee's reader.
Each part fails open: one that cannot install itself says so and leaves the process as it was.
"""

from __future__ import annotations

import faulthandler
import functools
import importlib
import importlib.abc
import importlib.machinery
import json
import math
import os
import signal
import socket
import sys
import time
import traceback
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ddp_contract import envnames as names
from ddp_contract.failureline import format_line

from ..errors import ConfigError, ExitCode

C10D = "torch.distributed.distributed_c10d"
STACKS_SIGNAL = signal.SIGUSR1
# At most one progress message this often (a loss read off a GPU is a sync); the last is always sent.
PROBE_INTERVAL_S = 0.5
# How long the last message may wait for room in the runtime's queue (the others are dropped when it is full).
LAST_MESSAGE_WAIT_S = 2.0
# What torchrun's agent raises when a worker failed or it was signalled: not a failure of its own.
LAUNCHER_ERRORS = frozenset({"ChildFailedError", "SignalException"})

Patch = Callable[[types.ModuleType], None]


class WorldSizeMismatch(ConfigError):
    """A process group of another size than the job's gang."""


def install(environ: Mapping[str, str] = os.environ) -> None:
    """Install every part in this process when it runs under the runtime (FAILURE_DIR set)."""
    if not environ.get(names.FAILURE_DIR):
        return
    patches: dict[str, Patch] = {C10D: check_world_size}
    channel = Channel.of(environ)
    if channel is not None:
        patches.update(trainer_patches(channel))
    for part in (_stacks_on_signal, _record_uncaught, functools.partial(_watch_imports, patches)):
        try:
            part()
        except Exception as error:  # noqa: BLE001 - see the module docstring
            print(f"ddp-trainer: {getattr(part, '__name__', 'a hook')} is off in this process: {error}", file=sys.stderr)


def _stacks_on_signal() -> None:
    if signal.getsignal(STACKS_SIGNAL) in (signal.SIG_DFL, None):
        faulthandler.register(STACKS_SIGNAL, all_threads=True)


def _record_uncaught() -> None:
    previous = sys.excepthook

    def record(kind: type[BaseException], error: BaseException, tb: types.TracebackType | None) -> None:
        previous(kind, error, tb)
        if kind.__name__ in LAUNCHER_ERRORS:  # a launcher's report of its workers' failure, recorded by them
            return
        try:
            leave_failure(error, os.environ)
        except Exception as failed:  # noqa: BLE001 - the traceback above is already out
            print(f"ddp-trainer: the failure was not recorded: {failed}", file=sys.stderr)

    sys.excepthook = record


def leave_failure(error: BaseException, environ: Mapping[str, str], pid: int | None = None) -> str:
    """The failure line (after the traceback's end) for `error` in FAILURE_DIR/<pid>; returns its path."""
    code = _classify(error)
    lines = traceback.format_exception(error)
    rank = environ.get(names.RANK, "").strip()
    message = f"{type(error).__name__}: {error}" if code == ExitCode.USER_ERROR else str(error)
    line = format_line(int(rank) if rank.isdigit() else None, None, int(code), code.name, code.retryable, message)
    path = os.path.join(environ[names.FAILURE_DIR], f"{os.getpid() if pid is None else pid}.txt")
    with open(path, "w") as f:
        f.write("".join(lines[-6:]) + line + "\n")
    return path


def _classify(error: BaseException) -> ExitCode:
    if "torch" not in sys.modules:  # nothing of torch's can have failed; classify would import it
        return getattr(error, "exit_code", ExitCode.USER_ERROR)
    from .rankexit import classify

    return classify(error)


def _watch_imports(patches: Mapping[str, Patch]) -> None:
    waiting = {}
    for name, patch in patches.items():
        if name in sys.modules:  # imported before this hook (never from sitecustomize): patched as it is
            patch(sys.modules[name])
        else:
            waiting[name] = patch
    sys.meta_path.insert(0, PatchOnImport(waiting))


def check_world_size(c10d: types.ModuleType) -> None:
    """Wrap c10d's init_process_group: the group must be the job's gang, and rank 0 says it formed."""
    original = c10d.init_process_group
    if getattr(original, "_ddp_checked", False):
        return
    started = time.time()

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        size, rank = c10d.get_world_size(), c10d.get_rank()
        problem = world_size_problem(size, os.environ)
        if problem:
            c10d.destroy_process_group()
            raise WorldSizeMismatch(problem)
        if rank == 0:
            _say_formed(os.environ, started)
        return result

    init_process_group._ddp_checked = True  # type: ignore[attr-defined]
    init_process_group.__wrapped__ = original  # type: ignore[attr-defined]
    init_process_group.__doc__ = original.__doc__
    setattr(c10d, "init_process_group", init_process_group)  # noqa: B010 - a module's attribute, typed as none


def world_size_problem(size: int, environ: Mapping[str, str]) -> str | None:
    """What is wrong with a process group of `size` ranks in this job, or None."""
    expected = environ.get(names.GANG_WORLD_SIZE, "").strip()
    if not expected.isdigit() or int(expected) == size:
        return None
    per_pod = environ.get(names.LOCAL_WORLD_SIZE, "1")
    return (f"this process joined a process group of {size} rank{'s' if size != 1 else ''}, but the job's gang has "
            f"{expected} ({per_pod} in each pod): each group would train a model of its own. Start the ranks with "
            "torchrun or torch.distributed.launch without --nnodes/--nproc-per-node/--node-rank (the pod's PET_* "
            "settings give the job's), once per pod (not a launcher inside another), or call init_process_group "
            "without world_size and rank (env://, the pod's WORLD_SIZE and RANK)")


def _say_formed(environ: Mapping[str, str], started: float) -> None:
    path = environ.get(names.FORMED_FILE)
    if not path:
        return
    fresh = f"{path}.{os.getpid()}"
    with open(fresh, "w") as f:
        json.dump({"attempt": int(environ.get(names.ATTEMPT, "0") or 0), "time": time.time(),
                   "initSeconds": round(time.time() - started, 3)}, f)
    os.replace(fresh, path)


HUGGING_FACE_TRAINERS = ("transformers.trainer",)
LIGHTNING_TRAINERS = ("lightning.pytorch.trainer.trainer", "pytorch_lightning.trainer.trainer")


Deliver = Callable[[Mapping[str, Any], float], None]  # (message, seconds it may wait for room)


class Channel:
    """Progress messages to the pod's runtime (`deliver`), never waited for but the last."""

    def __init__(self, deliver: Deliver) -> None:
        self.deliver = deliver
        self._last = float("-inf")

    @classmethod
    def of(cls, environ: Mapping[str, str]) -> Channel | None:
        """A command's processes: a datagram each (a JSON object) on envnames.PROGRESS_SOCKET."""
        path = environ.get(names.PROGRESS_SOCKET, "").strip()
        return cls(_datagrams(path)) if path else None

    def due(self) -> bool:
        """Whether a message may go now (one per PROBE_INTERVAL_S)."""
        return time.monotonic() - self._last >= PROBE_INTERVAL_S

    def send(self, record: Mapping[str, Any], last: bool = False) -> None:
        """`last`: training ended; this message, its last step, waits up to LAST_MESSAGE_WAIT_S for room."""
        self._last = time.monotonic()
        try:
            self.deliver(record, LAST_MESSAGE_WAIT_S if last else 0.0)
        except Exception:  # noqa: BLE001 - the runtime is not listening (yet), or its queue is full: the next will do
            pass


def _datagrams(path: str) -> Deliver:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)

    def deliver(record: Mapping[str, Any], wait_s: float) -> None:
        sock.settimeout(wait_s)  # 0: never blocks; a full queue drops the message
        sock.sendto(json.dumps(record).encode(), path)

    return deliver


def trainer_patches(channel: Channel) -> dict[str, Patch]:
    """The patches that add a progress callback to every Hugging Face and Lightning trainer made."""
    return {**dict.fromkeys(HUGGING_FACE_TRAINERS, functools.partial(probe_hugging_face, channel=channel)),
            **dict.fromkeys(LIGHTNING_TRAINERS, functools.partial(probe_lightning, channel=channel))}


def watch_trainers(deliver: Deliver) -> None:
    """This process's Hugging Face and Lightning trainers say how far they are to `deliver` (an
    entrypoint's rank: its tee's reader); fails open, as `install`'s parts do."""
    try:
        _watch_imports(trainer_patches(Channel(deliver)))
    except Exception as error:  # noqa: BLE001 - training goes on; the bars and lines still say progress
        print(f"ddp-trainer: trainers' progress is not read in this process: {error}", file=sys.stderr)


def _number(value: Any) -> float | None:
    try:
        number = float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError, RuntimeError):
        return None
    return number if math.isfinite(number) else None


def _after_init(cls: Any, add: Callable[[Any], None]) -> None:
    """Run `add(trainer)` after each `cls(...)` made a trainer (once: a class patched already stays so)."""
    original = cls.__init__
    if getattr(original, "_ddp_progress", False):
        return

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            add(self)
        except Exception as error:  # noqa: BLE001 - the trainer works as it is
            print(f"ddp-trainer: {cls.__name__}'s progress is not read: {error}", file=sys.stderr)

    __init__._ddp_progress = True  # type: ignore[attr-defined]
    cls.__init__ = __init__


def probe_hugging_face(module: types.ModuleType, channel: Channel) -> None:
    """A TrainerCallback on every transformers Trainer: global step of max_steps, epoch, logged loss."""
    base: Any = importlib.import_module("transformers.trainer_callback").TrainerCallback  # loaded already

    class DDPJobProgress(base):
        loss: float | None = None

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.is_world_process_zero and channel.due():
                channel.send(self._said(state))

        def on_log(self, args: Any, state: Any, control: Any, logs: Mapping[str, Any] | None = None,
                   **kwargs: Any) -> None:
            if logs and "loss" in logs:
                self.loss = _number(logs["loss"])

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.is_world_process_zero:  # the last step, and the loss logged after it
                channel.send(self._said(state), last=True)

        def _said(self, state: Any) -> dict[str, Any]:
            return {"step": state.global_step, "total": state.max_steps, "epoch": state.epoch, "loss": self.loss}

    _after_init(module.Trainer, lambda trainer: trainer.add_callback(DDPJobProgress()))


def probe_lightning(module: types.ModuleType, channel: Channel) -> None:
    """A Callback on every Lightning Trainer: global step of the estimated total, epoch, the step's loss."""
    package = module.__name__.removesuffix(".trainer.trainer")
    base: Any = importlib.import_module(f"{package}.callbacks").Callback

    class DDPJobProgress(base):
        total: float | None = None
        loss: Any = None  # the last step's, read (a sync on a GPU) only when a message goes

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            self.total = _number(trainer.estimated_stepping_batches)

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            if not trainer.is_global_zero:
                return
            self.loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
            if channel.due():
                batches = _number(trainer.num_training_batches)
                epoch = trainer.current_epoch + (min(1.0, (batch_idx + 1) / batches) if batches else 0.0)
                channel.send(self._said(trainer, epoch))

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            if trainer.is_global_zero:  # the last step: the epochs done
                channel.send(self._said(trainer, float(trainer.current_epoch)), last=True)

        def _said(self, trainer: Any, epoch: float) -> dict[str, Any]:
            return {"step": trainer.global_step, "total": self.total, "epoch": epoch, "loss": _number(self.loss)}

    _after_init(module.Trainer, lambda trainer: trainer.callbacks.append(DDPJobProgress()))


class PatchOnImport(importlib.abc.MetaPathFinder):
    """Runs `patches[name](module)` right after module `name` is first executed, before any importer
    sees it (a package's `from .module import *` takes the patched names)."""

    def __init__(self, patches: Mapping[str, Patch]) -> None:
        self.patches = dict(patches)

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        patch = self.patches.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _PatchingLoader(spec.loader, patch)
        return spec


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, patch: Patch) -> None:
        self.loader, self.patch = loader, patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        module: types.ModuleType | None = self.loader.create_module(spec)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        self.loader.exec_module(module)
        try:
            self.patch(module)
        except Exception as error:  # noqa: BLE001 - the module works as it is
            print(f"ddp-trainer: {module.__name__} is not watched in this process: {error}", file=sys.stderr)

    def __getattr__(self, name: str) -> Any:  # get_source, is_package, ... as the real loader has them
        return getattr(self.loader, name)
