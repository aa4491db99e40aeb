"""Runs the user's code in one rank: check env, wait for the master, init, run, tear down.

Usage: ``python -m ddp_trainer run [TARGET] [ARGS...]`` where TARGET is ``module:function``,
``module`` or ``path/to/script.py`` (default: $DDP_ENTRYPOINT). ARGS become ``sys.argv[1:]``.
A ``module:function`` target is called with no arguments, or with the `RankContext` if it takes
one positional parameter. The process group is already initialised when the user code runs.

`run` is the sequence; each step is in the module named for it: `inplace` (restartStrategy InPlace:
the pod's rank processes across attempts), `supervisor` (a pod of several ranks), `target`,
`rendezvous`, `context`, `hangwatch`, `signals`, `failures` (exit codes and the failure line) and
`process_exit`.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Sequence

from ddp_contract import envnames as names

from .. import env
from ..errors import ConfigError, ExitCode, TrainerError
from . import inplace, inprocess, logkeeper, progress, supervisor
from .command import CommandProcess
from .command import run as run_command_once
from .context import RankContext, set_context, target_world_size
from .formed import record_formed
from .hangwatch import HangWatch, hang_handler, stall_handler
from .heartbeat import HEARTBEAT
from .printedmetrics import PrintedMetrics
from .rankexit import classify, exit_code_of_system_exit, report
from .rendezvous import destroy_process_group, gang_check, init_distributed, wait_for_master, wait_for_port
from .signals import dies_on_sigterm, stop_on_sigterm
from .target import load_target

log = logging.getLogger("ddp_trainer")


def run_command(command: Sequence[str], environ: dict[str, str] | None = None) -> int:
    """`ddp-trainer exec -- CMD...`: a job's command in this pod under the runtime (runtime/command.py),
    attempt after attempt under restartStrategy InPlace; the container's exit code."""
    environ = dict(os.environ) if environ is None else environ
    try:
        if inplace.is_in_place(environ):
            return inplace.serve(CommandProcess(command, environ), environ)
        return run_command_once(command, environ)
    except TrainerError as exc:
        report(exc.exit_code, None, exc)
        return exc.exit_code


def watch_trainers(keeper: logkeeper.LogKeeper | None) -> None:
    """Rank 0's Hugging Face and Lightning trainers say their step of how many to what reads its output
    for progress, as a command's do (runtime/inprocess.py): the bars alone say no step under Lightning."""
    printed = PrintedMetrics.among(keeper.listeners) if keeper is not None else None
    if printed is not None and printed.reporter is not None:
        inprocess.watch_trainers(printed.probe)


def run(target: str | None, args: Sequence[str], environ: dict[str, str] | None = None) -> int:
    """Run one rank to completion and return the process exit code."""
    environ = dict(os.environ) if environ is None else environ
    rank: int | None = None
    HEARTBEAT.reset()
    try:
        if inplace.is_in_place(environ):
            return inplace.serve(supervisor.LocalRanks(target, args, environ), environ)
        if supervisor.is_launcher(environ):
            return supervisor.launch(target, args, environ)
    except TrainerError as exc:
        report(exc.exit_code, None, exc)
        return exc.exit_code
    try:
        target = target or environ.get(names.ENTRYPOINT, "").strip()
        if not target:
            raise ConfigError(f"no entrypoint: pass `module:function` or a script, or set {names.ENTRYPOINT}")
        settings = env.DistSettings.from_env(environ)
        target_size = target_world_size(environ, settings.world_size)
        rank = settings.rank
        watch_trainers(logkeeper.start(rank, environ))
        stop_on_sigterm(rank)
        func = load_target(target)
        job = env.JobInfo.from_env(environ)
        hang_watch = HangWatch(HEARTBEAT, env.hang_timeout_s(environ), env.hang_min_s(environ),
                               hang_handler(rank, job.attempt), on_stall=stall_handler(rank, job.attempt))
        started = time.monotonic()
        wait_for_master(settings.master_addr, settings.master_wait_s)
        resolved_s = time.monotonic() - started
        if rank != 0:
            wait_for_port(settings.master_addr, settings.master_port, settings.master_wait_s, since=started)
        listening_s = time.monotonic() - started
    except BaseException as exc:  # noqa: BLE001 - every startup failure becomes an exit code
        # Anything but our own errors comes from importing the user's module: a user error.
        code = exc.exit_code if isinstance(exc, TrainerError) else ExitCode.USER_ERROR
        report(code, rank, exc)
        return code

    succeeded = False
    try:
        with dies_on_sigterm():
            backend, device = init_distributed(settings, job.attempt)
        check_s = gang_check(device)
        formed_s = time.monotonic() - started
        log.info("rank %d/%d joined (%s on %s): gang formed in %.2fs (rank 0's name resolved after %.2fs, its port"
                 " open after %.2fs), all-reduce check %.1f ms", settings.rank, settings.world_size, backend, device,
                 formed_s, resolved_s, listening_s, check_s * 1000)
        if settings.rank == 0:
            record_formed(job.attempt, formed_s, check_s)
        context = RankContext(
            rank=settings.rank,
            world_size=settings.world_size,
            local_rank=settings.local_rank,
            backend=backend,
            device=device,
            job=job,
            target_world_size=target_size,
        )
        set_context(context)
        sys.argv = [target, *args]
        hang_watch.start()
        func(context)
        succeeded = True
        return ExitCode.OK
    except SystemExit as exc:
        hang_watch.hold_if_fired()
        exit_code = exit_code_of_system_exit(exc)
        succeeded = exit_code == ExitCode.OK
        return exit_code
    except BaseException as exc:  # noqa: BLE001 - whatever the user code raises becomes its exit code
        hang_watch.hold_if_fired()
        code = classify(exc)
        report(code, rank, exc)
        return code
    finally:
        hang_watch.stop()
        set_context(None)
        progress.flush_reporters(succeeded)  # the last step reported, however soon after the one before it
        destroy_process_group()
