"""Joining the gang and leaving it: wait for rank 0's name and port, pick the backend, initialise the
process group, check it with an all-reduce before the user's code runs; destroy it afterwards."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from ddp_contract import envnames as names
from ddp_contract.backend import NCCL, resolve_backend

from .. import env
from ..errors import ConfigError, MasterUnresolvedError, RendezvousError
from .hangwatch import enable_nccl_flight_recorder

log = logging.getLogger("ddp_trainer")

_RESOLVE_ATTEMPT_TIMEOUT_S = 5.0
# Ranks kept through a restart may wait minutes for a replaced rank 0 and then join as soon as it
# listens: a longer gap between tries would be paid by the whole gang (a DNS query and a refused
# connection a second per rank is little to CoreDNS and rank 0's node).
_RESOLVE_MAX_BACKOFF_S = 1.0


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


# The key rank 0 stamps its rendezvous store with: the attempt (DDP_ATTEMPT) whose gang it gathers.
ATTEMPT_KEY = "ddp-trainer/attempt"
_STORE_TRY_S = 5.0  # how long one try to reach rank 0's store and read its stamp may take
_STORE_RETRY_S = 0.1


def gang_store(settings: env.DistSettings, attempt: int) -> Any:
    """The rendezvous store (a TCPStore on MASTER_PORT) of this attempt's gang.

    Rank 0 serves it and stamps it with `attempt`; every other rank joins only a store stamped with
    its own attempt. Under restartStrategy InPlace a kept rank 0's previous process can still serve the
    previous attempt's store (it is ending, or saving its logs) when the other ranks' next processes,
    forked in milliseconds, arrive: they wait for the store of their attempt instead of joining that
    one and failing with it. A rank of an attempt the store has passed fails at once."""
    import torch.distributed as dist

    timeout = timedelta(seconds=settings.init_timeout_s)
    host, port = settings.master_addr, settings.master_port
    if settings.rank == 0:
        store = dist.TCPStore(host, port, settings.world_size, is_master=True, timeout=timeout, wait_for_workers=False)
        store.set(ATTEMPT_KEY, str(attempt))
        return store
    deadline = time.monotonic() + settings.init_timeout_s
    said: int | None = None
    last: BaseException | None = None
    while True:
        left = deadline - time.monotonic()
        try:
            store = dist.TCPStore(host, port, settings.world_size, is_master=False,
                                  timeout=timedelta(seconds=max(min(_STORE_TRY_S, left), 0.1)), wait_for_workers=False)
            stamp = int(store.get(ATTEMPT_KEY))
        except (RuntimeError, ValueError) as exc:  # not listening yet, gone mid-read, or no stamp in time
            last = exc
        else:
            if stamp == attempt:
                store.set_timeout(timeout)
                return store
            if stamp > attempt:
                raise RendezvousError(f"rank 0's store at {host}:{port} gathers attempt {stamp}'s gang, not "
                                      f"this rank's attempt {attempt}: the job has restarted since this process started")
            if said != stamp:
                log.info("rank %d: rank 0's store at %s:%d still gathers attempt %d's gang; waiting for attempt %d's",
                         settings.rank, host, port, stamp, attempt)
                said = stamp
            del store
        if time.monotonic() + _STORE_RETRY_S > deadline:
            seen = f"the store of attempt {said}" if said is not None else f"last error: {last}"
            raise RendezvousError(f"no store of attempt {attempt}'s gang at {host}:{port} within "
                                  f"{settings.init_timeout_s:g}s ({seen})")
        time.sleep(_STORE_RETRY_S)


def init_distributed(settings: env.DistSettings, attempt: int) -> tuple[str, Any]:
    """Initialise the default process group through this attempt's store (gang_store); returns
    (backend, device)."""
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
            store=gang_store(settings, attempt),
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
