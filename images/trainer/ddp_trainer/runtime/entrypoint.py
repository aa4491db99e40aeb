"""Runs the user's code in one rank: check env, wait for the master, init, run, tear down.

Usage: ``python -m ddp_trainer run [TARGET] [ARGS...]`` where TARGET is ``module:function``,
``module`` or ``path/to/script.py`` (default: $DDP_ENTRYPOINT). ARGS become ``sys.argv[1:]``.
A ``module:function`` target is called with no arguments, or with the `RankContext` if it takes
one positional parameter. The process group is already initialised when the user code runs.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import inspect
import logging
import os
import runpy
import signal
import socket
import sys
import threading
import time
import traceback
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ddp_contract import envnames as names
from ddp_contract.backend import NCCL, resolve_backend
from ddp_contract.failures import format_line
from ddp_contract.targets import SCRIPT_FUNCTION_RE

from .. import env, jobstatus
from ..errors import (
    ConfigError,
    ExitCode,
    MasterUnresolvedError,
    RendezvousError,
    TrainerError,
)
from . import logkeeper, progress, supervisor
from .hangwatch import LINGER_SECONDS, Hang, HangWatch, enable_nccl_flight_recorder, nccl_flight_record, python_stacks, save_dump
from .heartbeat import HEARTBEAT
from .termination import leave_termination_message

log = logging.getLogger("ddp_trainer")

_RESOLVE_ATTEMPT_TIMEOUT_S = 5.0
_RESOLVE_MAX_BACKOFF_S = 5.0


@dataclass(frozen=True)
class RankContext:
    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: Any  # torch.device; typed loosely so this module imports without torch
    job: env.JobInfo


_context: RankContext | None = None


def context() -> RankContext:
    """The running rank's context; only valid inside code started by the entrypoint."""
    if _context is None:
        raise RuntimeError("ddp_trainer.context() is only available inside `python -m ddp_trainer run`")
    return _context


def _resolve_once(host: str, timeout_s: float) -> bool:
    """getaddrinfo can block far longer than we want to wait, so it runs in a daemon thread."""
    result: list[bool] = []

    def attempt() -> None:
        try:
            result.append(bool(socket.getaddrinfo(host, None)))
        except OSError:
            result.append(False)

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(timeout_s)
    return bool(result and result[0])


def _poll_with_backoff(try_once: Callable[[float], bool], deadline: float, delay: float) -> tuple[bool, int]:
    """Calls `try_once(seconds left)` until it returns True or the deadline (a time.monotonic()) has
    passed, sleeping between tries with doubling delays; returns whether it succeeded and the tries."""
    tries = 0
    while True:
        tries += 1
        if try_once(max(deadline - time.monotonic(), 0.1)):
            return True, tries
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False, tries
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, _RESOLVE_MAX_BACKOFF_S)


def wait_for_master(host: str, timeout_s: float) -> None:
    """Wait, with backoff, until `host` resolves; the master's DNS record can lag its pod."""
    resolved, tries = _poll_with_backoff(lambda left: _resolve_once(host, min(_RESOLVE_ATTEMPT_TIMEOUT_S, left)),
                                         time.monotonic() + timeout_s, 0.2)
    if not resolved:
        raise MasterUnresolvedError(
            f"{names.MASTER_ADDR}={host!r} did not resolve after {tries} attempts in {timeout_s:g}s "
            f"(set {names.MASTER_WAIT_SECONDS} to wait longer)"
        )


def wait_for_port(host: str, port: int, timeout_s: float, since: float | None = None) -> float:
    """Wait until rank 0's rendezvous port accepts a connection (a name that resolves is not yet a
    rank 0 that listens), up to `timeout_s` after `since` (a time.monotonic(); default now);
    returns the seconds waited."""
    started = time.monotonic()
    errors: list[OSError] = []

    def connect(left: float) -> bool:
        try:
            with socket.create_connection((host, port), timeout=min(5.0, left)):
                return True
        except OSError as error:
            errors.append(error)
            return False

    accepted, _ = _poll_with_backoff(connect, (started if since is None else since) + timeout_s, 0.1)
    if not accepted:
        raise RendezvousError(
            f"rank 0 at {host}:{port} did not accept connections within {timeout_s:g}s "
            f"(last error: {errors[-1] if errors else None}); is rank 0 running, and is {names.MASTER_PORT} "
            "reachable from this node?"
        )
    return time.monotonic() - started


def gang_check(device: Any) -> float:
    """A one-element all-reduce across the gang: proves every rank can talk to every other before
    the user's code runs; returns its time in seconds."""
    import torch
    import torch.distributed as dist

    started = time.monotonic()
    probe = torch.ones(1, device=device)
    dist.all_reduce(probe)
    if int(probe.item()) != dist.get_world_size():
        raise RendezvousError(f"the gang check all-reduce summed to {probe.item():g}, not {dist.get_world_size()}")
    return time.monotonic() - started


def select_backend(requested: str, cuda_available: bool) -> str:
    """The contract's rule (auto: nccl with a GPU, gloo without), refusing nccl on a rank without CUDA."""
    backend = resolve_backend(requested, cuda_available)
    if backend == NCCL and not cuda_available:
        raise ConfigError(f"{names.BACKEND}=nccl but this rank has no CUDA device")
    return backend


def init_distributed(settings: env.DistSettings) -> tuple[str, Any]:
    """Initialise the default process group; returns (backend, device)."""
    import torch
    import torch.distributed as dist

    backend = select_backend(settings.backend, torch.cuda.is_available())
    if backend == NCCL:
        if settings.local_rank >= torch.cuda.device_count():
            raise ConfigError(
                f"{names.LOCAL_RANK}={settings.local_rank} but only {torch.cuda.device_count()} CUDA devices are visible"
            )
        torch.cuda.set_device(settings.local_rank)
        device = torch.device("cuda", settings.local_rank)
        enable_nccl_flight_recorder()
    else:
        device = torch.device("cpu")
    os.environ[names.MASTER_ADDR] = settings.master_addr
    os.environ[names.MASTER_PORT] = str(settings.master_port)
    try:
        dist.init_process_group(
            backend=backend,
            init_method="env://",
            rank=settings.rank,
            world_size=settings.world_size,
            timeout=timedelta(seconds=settings.init_timeout_s),
        )
    except (RuntimeError, ValueError, OSError) as exc:
        raise RendezvousError(
            f"joining the process group at {settings.master_addr}:{settings.master_port} "
            f"(rank {settings.rank} of {settings.world_size}, backend {backend}, "
            f"timeout {settings.init_timeout_s:g}s) failed: {exc}"
        ) from exc
    return backend, device


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


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


_COMMUNICATION_MARKERS = ("gloo", "nccl", "connection closed by peer", "connection reset by peer", "broken pipe")


def classify(exc: BaseException) -> ExitCode:
    """Map an exception escaping the user's code to an exit code (see errors.ExitCode)."""
    import torch.distributed as dist

    for item in _chain(exc):
        if isinstance(item, TrainerError):
            return item.exit_code
        if isinstance(item, (dist.DistStoreError, dist.DistNetworkError)):
            return ExitCode.COMMUNICATION_ERROR
        if isinstance(item, dist.DistBackendError):
            return ExitCode.COMMUNICATION_ERROR
        if type(item).__module__.startswith(("botocore", "urllib3")) and _is_connection_error(item):
            return ExitCode.STORAGE_UNAVAILABLE
        # Older torch builds raise a bare RuntimeError from the backends.
        if type(item) is RuntimeError and any(m in str(item).lower() for m in _COMMUNICATION_MARKERS):
            return ExitCode.COMMUNICATION_ERROR
    return ExitCode.USER_ERROR


def _is_connection_error(exc: BaseException) -> bool:
    from botocore.exceptions import ConnectionError as BotoConnectionError
    from botocore.exceptions import ConnectTimeoutError, ReadTimeoutError

    return isinstance(exc, (BotoConnectionError, ConnectTimeoutError, ReadTimeoutError))


def _exit_code_of_system_exit(exc: SystemExit) -> int:
    if exc.code is None:
        return ExitCode.OK
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return ExitCode.USER_ERROR


def _report(code: ExitCode, rank: int | None, exc: BaseException) -> None:
    lines: list[str] = []
    error = str(exc)
    if code == ExitCode.USER_ERROR and not isinstance(exc, TrainerError):
        lines = traceback.format_exception(exc)
        sys.stderr.write("".join(lines))
        error = f"{type(exc).__name__}: {exc}"
    _last_words(code, rank, error, "".join(lines[-6:]))


def _last_words(code: ExitCode, rank: int | None, error: str, before: str = "") -> None:
    """The failure line (rank, step, exit code, error; ddp_contract.failures) on stderr and in the
    termination message, after `before` (the end of a traceback)."""
    line = format_line(rank, HEARTBEAT.step, int(code), code.name, code.retryable, error)
    print(line, file=sys.stderr, flush=True)
    leave_termination_message(before + line)


def _stop_on_sigterm(rank: int | None) -> None:
    """A deleted pod's container gets SIGTERM, and a Python PID 1 ignores it unless handled: the pod
    would then wait out its whole grace period, and every gang restart with it. Exit at once with
    TERMINATED (peers see the connection drop), saying why."""
    if threading.current_thread() is not threading.main_thread():
        return

    def stop(signum: int, frame: object) -> None:
        _last_words(ExitCode.TERMINATED, rank, "stopped by SIGTERM (pod deleted, node drained or job preempted)")
        exit_process(ExitCode.TERMINATED)

    signal.signal(signal.SIGTERM, stop)


def _on_stall(rank: int, attempt: int) -> Callable[[Hang], None]:
    def dump_ahead(stall: Hang) -> None:
        where = save_dump(rank, attempt, python_stacks(), nccl_flight_record())
        log.warning("rank %d: no progress for %.0fs since step %s (hang timeout %.0fs): stacks saved ahead to %s",
                    rank, stall.stalled_s, stall.step, stall.timeout_s, where)

    return dump_ahead


def _on_hang(rank: int, attempt: int) -> Callable[[Hang], None]:
    def dump_and_exit(hang: Hang) -> None:
        stacks = python_stacks()
        sys.stderr.write(f"ddp-trainer: rank {rank} hung: {hang.describe()}; stacks:\n{stacks}\n")
        where = save_dump(rank, attempt, stacks, nccl_flight_record())
        _last_words(ExitCode.HUNG, rank, f"{hang.describe()}; stacks in {where}")
        time.sleep(LINGER_SECONDS)
        exit_process(ExitCode.HUNG)

    return dump_and_exit


def run(target: str | None, args: Sequence[str], environ: dict[str, str] | None = None) -> int:
    """Run one rank to completion and return the process exit code."""
    global _context
    environ = dict(os.environ) if environ is None else environ
    rank: int | None = None
    HEARTBEAT.reset()
    try:
        if supervisor.is_launcher(environ):
            return supervisor.launch(target, args, environ)
    except TrainerError as exc:
        _report(exc.exit_code, None, exc)
        return exc.exit_code
    try:
        target = target or environ.get(names.ENTRYPOINT, "").strip()
        if not target:
            raise ConfigError(f"no entrypoint: pass `module:function` or a script, or set {names.ENTRYPOINT}")
        settings = env.DistSettings.from_env(environ)
        rank = settings.rank
        logkeeper.start(rank, environ)
        _stop_on_sigterm(rank)
        func = load_target(target)
        job = env.JobInfo.from_env(environ)
        hang_watch = HangWatch(HEARTBEAT, env.hang_timeout_s(environ), env.hang_min_s(environ), _on_hang(rank, job.attempt),
                               on_stall=_on_stall(rank, job.attempt))
        started = time.monotonic()
        wait_for_master(settings.master_addr, settings.master_wait_s)
        if rank != 0:
            wait_for_port(settings.master_addr, settings.master_port, settings.master_wait_s, since=started)
    except BaseException as exc:  # noqa: BLE001 - every startup failure becomes an exit code
        # Anything but our own errors comes from importing the user's module: a user error.
        code = exc.exit_code if isinstance(exc, TrainerError) else ExitCode.USER_ERROR
        _report(code, rank, exc)
        return code

    try:
        backend, device = init_distributed(settings)
        check_s = gang_check(device)
        formed_s = time.monotonic() - started
        log.info("rank %d/%d joined (%s on %s): gang formed in %.2fs, all-reduce check %.1f ms", settings.rank,
                 settings.world_size, backend, device, formed_s, check_s * 1000)
        if settings.rank == 0:
            jobstatus.record({"rendezvous": jobstatus.rendezvous(job.attempt, formed_s, check_s)})
        _context = RankContext(
            rank=settings.rank,
            world_size=settings.world_size,
            local_rank=settings.local_rank,
            backend=backend,
            device=device,
            job=job,
        )
        sys.argv = [target, *args]
        hang_watch.start()
        func(_context)
        return ExitCode.OK
    except SystemExit as exc:
        hang_watch.hold_if_fired()
        return _exit_code_of_system_exit(exc)
    except BaseException as exc:  # noqa: BLE001 - whatever the user code raises becomes its exit code
        hang_watch.hold_if_fired()
        code = classify(exc)
        _report(code, rank, exc)
        return code
    finally:
        hang_watch.stop()
        _context = None
        progress.flush_reporters()  # the last step reported, however soon after the one before it
        destroy_process_group()


_DESTROY_TIMEOUT_S = 30.0


def destroy_process_group(timeout_s: float = _DESTROY_TIMEOUT_S) -> bool:
    """Destroy the default group if there is one; bounded, because after a peer failure the
    backend can block in teardown. Returns False when it did not finish in time or failed."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return True
    outcome: list[BaseException | None] = []

    def destroy() -> None:
        try:
            dist.destroy_process_group()
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - reported below, the exit code is already decided
            outcome.append(exc)

    thread = threading.Thread(target=destroy, name="ddp-destroy", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not outcome:
        log.warning("destroy_process_group did not finish in %gs; exiting anyway", timeout_s)
        return False
    if outcome[0] is not None:
        log.warning("destroy_process_group failed: %s", outcome[0])
        return False
    return True


def exit_process(code: int) -> None:
    """Exit with `code`, skipping the interpreter's teardown and the C exit handlers after it: C++
    threads left by the backend or DDP can abort the process there (SIGABRT, "terminate called
    without an active exception"), after a broken collective and now and then after a clean run,
    which would turn the rank's code into a crash. A clean exit first does what Python's own exit
    does before its teardown: waits for the user's non-daemon threads and runs the atexit handlers;
    a failure skips them (its code is decided). What the rank printed goes to S3 first (logkeeper)."""
    if code == ExitCode.OK:
        _join_user_threads()
        atexit._run_exitfuncs()  # Python's exit runs them (logging.shutdown among them) before its teardown
    logkeeper.finish()
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


def _join_user_threads() -> None:
    """What Python's exit does first: wait for every non-daemon thread still running."""
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
