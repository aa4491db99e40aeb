"""SIGTERM stops a rank at once, in a real process."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from trainerhelp import ROOT, rank_env

from ddp_contract.failureline import parse_line
from ddp_trainer.errors import ExitCode
from ports import free_port
from waiting import poll_until


def test_sigterm_stops_a_rank_at_once_with_its_own_exit_code(tmp_path: Path) -> None:
    ready, message = tmp_path / "ready", tmp_path / "termination-log"
    message.touch()
    env = rank_env({"WL_READY_FILE": str(ready), "DDP_TERMINATION_MESSAGE_PATH": str(message),
                    "DDP_PROGRESS_FILE": str(tmp_path / "progress.json")}, 0, 1, free_port())
    proc = subprocess.Popen([sys.executable, "-m", "ddp_trainer", "run", "ddp_workloads:wait_for_sigterm"],
                            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        poll_until(lambda: ready.exists() or proc.poll() is not None, 60, interval=0.05)
        assert ready.exists(), proc.communicate(timeout=10)
        sent = time.monotonic()
        proc.terminate()
        _, stderr = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert proc.returncode == ExitCode.TERMINATED == 143, stderr
    assert time.monotonic() - sent < 5
    line = parse_line(message.read_text())
    assert line is not None and line.step == 7 and "stopped by SIGTERM" in line.error


def test_sigterm_ends_a_rank_stuck_joining_a_rank_0_that_never_answers(tmp_path: Path) -> None:
    """A rank 0 whose pod is gone leaves its peers inside init_process_group, where Python runs no
    signal handler; a restart in place must not wait for their SIGKILL (nor for the init timeout)."""
    silent = socket.create_server(("127.0.0.1", 0))  # accepts, and never says a word: a store that hangs
    joined = threading.Event()
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                peer, _ = silent.accept()
            except OSError:
                return
            held.append(peer)
            if len(held) > 1:  # the port check's connection, then the store client's
                joined.set()

    threading.Thread(target=accept, daemon=True).start()
    env = rank_env({"DDP_TERMINATION_MESSAGE_PATH": str(tmp_path / "termination-log"), "DDP_INIT_TIMEOUT_SECONDS": "120"},
                   1, 2, silent.getsockname()[1])
    proc = subprocess.Popen([sys.executable, "-m", "ddp_trainer", "run", "ddp_workloads:wait_for_sigterm"],
                            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert joined.wait(60), proc.poll()
        sent = time.monotonic()
        proc.terminate()
        proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        proc.kill()
        silent.close()
        for peer in held:
            peer.close()
    assert proc.returncode == -15 and took < 5  # ended by the signal itself: no handler had to run


def test_a_sigterm_while_the_rank_already_exits_lets_that_exit_finish(monkeypatch, tmp_path: Path) -> None:
    """A gang restart's SIGTERM often reaches a rank that failed a moment ago and is uploading its
    last words: the handler must leave that exit (its code, its upload) alone."""
    import signal

    from ddp_trainer.runtime import process_exit, signals

    monkeypatch.setenv("DDP_TERMINATION_MESSAGE_PATH", str(tmp_path / "termination-log"))
    before = signal.getsignal(signal.SIGTERM)
    exits: list[int] = []
    monkeypatch.setattr(signals, "exit_process", exits.append)
    try:
        signals.stop_on_sigterm(0)
        handler = signal.getsignal(signal.SIGTERM)
        assert callable(handler)
        monkeypatch.setattr(process_exit, "_EXITING", type(process_exit._EXITING)())
        process_exit._EXITING.set()
        handler(signal.SIGTERM, None)
        assert exits == []
        process_exit._EXITING.clear()
        handler(signal.SIGTERM, None)
        assert exits == [ExitCode.TERMINATED]
    finally:
        signal.signal(signal.SIGTERM, before)
