"""A process that has imported what every rank imports (torch, the runtime), forking rank processes
on request: an InPlace pod's next attempt starts its ranks without paying those imports again (one
to two seconds a rank, more where ranks share few cores).

The supervisor (`supervisor.LocalRanks`) starts one per pod once the attempt's gang has formed, and
asks it for each rank of the next attempt: one JSON line on its stdin ({"target", "args", "env"})
answered on a pipe of its own ({"pid": N}); it reports each child's end ({"exited": N, "code": C},
C as Popen's returncode). The children write to the container's stdout and stderr, as a rank process
started anew would. Forking after `import torch` is what a DataLoader's worker processes rely on too;
the zygote never runs an operator or touches CUDA, so each child initialises its own. Python's
`random` reseeds itself in a forked child, and numpy's global generator is reseeded there, so each
rank process draws as one started anew would.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ddp_contract import envnames as names

# What the zygote imports before it says it is ready: what every rank imports before it trains. torch
# imports torch._dynamo when the first optimizer is made (torch._compile's wrapper of add_param_group):
# 1.1-2 s of a restarted rank's time to training on 2 cores; the Kubernetes client (rank 0's status
# writes) 0.7 s, boto3 0.2 s. None of them starts a thread.
IMPORTS = ("torch", "torch.distributed", "torch.nn.parallel", "torch.utils.data", "torch._dynamo", "boto3",
           "kubernetes.client", "ddp_trainer.runtime.entrypoint", "ddp_trainer.storage.checkpoint",
           "ddp_trainer.storage.results", "ddp_trainer.data.sampler")
READY_WAIT_S = 30.0  # how long a fork request waits for the zygote's imports before the rank is started anew
ANSWER_WAIT_S = 5.0  # how long it waits for the child's pid
POLL_S = 0.05


class Zygote:
    """The supervisor's side: the zygote process, and the children it forked for this pod."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        read, write = os.pipe()
        self.process = subprocess.Popen([sys.executable, "-m", "ddp_trainer", "zygote", str(write)],
                                        stdin=subprocess.PIPE, pass_fds=(write,), env={**environ, names.ZYGOTE: "1"})
        os.close(write)
        os.set_blocking(read, False)
        self._answers = read
        self._pending = b""
        self.ready = False
        self.pids: list[int] = []
        self.ended: dict[int, int] = {}
        self._abandoned = 0  # requests given up on: the children they fork later are killed on arrival

    def fork(self, target: str | None, args: Sequence[str], environ: Mapping[str, str]) -> ForkedProcess | None:
        """A rank process forked to run `target` with `args` and `environ` (as `python -m ddp_trainer run`
        would); None when
        the zygote has gone or is not ready within READY_WAIT_S (the caller starts the rank anew). Its
        imports under way are still sooner done than a new process's."""
        self._wait(lambda: self.ready, READY_WAIT_S)
        if not self.ready or self.process.poll() is not None or self.process.stdin is None:
            return None
        known = len(self.pids)
        try:
            request = {"target": target, "args": list(args), "env": dict(environ)}
            self.process.stdin.write(json.dumps(request).encode() + b"\n")
            self.process.stdin.flush()
        except OSError:
            return None
        self._wait(lambda: len(self.pids) > known, ANSWER_WAIT_S)
        if len(self.pids) > known:
            return ForkedProcess(self, self.pids[known])
        self._abandoned += 1  # the caller starts this rank anew: a child forked late would be a second one
        return None

    def _wait(self, done: Callable[[], bool], timeout: float) -> None:
        """Reads what the zygote says until `done()`, `timeout` seconds, or the zygote's end."""
        deadline = time.monotonic() + timeout
        self.read()
        while not done() and time.monotonic() < deadline and self.process.poll() is None:
            select.select([self._answers], [], [], POLL_S)
            self.read()

    def read(self) -> None:
        """Takes in what the zygote said since the last look."""
        while True:
            try:
                chunk = os.read(self._answers, 65536)
            except BlockingIOError:
                return
            except OSError:
                return
            if not chunk:
                return
            self._pending += chunk
            while b"\n" in self._pending:
                line, self._pending = self._pending.split(b"\n", 1)
                self._take(json.loads(line))

    def _take(self, answer: Mapping[str, Any]) -> None:
        if answer.get("ready"):
            self.ready = True
        elif "pid" in answer and self._abandoned:  # answers come in the order asked
            self._abandoned -= 1
            _kill(int(answer["pid"]))
        elif "pid" in answer:
            self.pids.append(int(answer["pid"]))
        elif "exited" in answer:
            self.ended[int(answer["exited"])] = int(answer["code"])

    def close(self) -> None:
        """Ends the zygote (its children are the supervisor's to end)."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        os.close(self._answers)


class ForkedProcess:
    """A rank process the zygote forked, with what the supervisor uses of a subprocess.Popen."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self.zygote, self.pid = zygote, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.zygote.read()
            if self.pid in self.zygote.ended:
                self.returncode = self.zygote.ended[self.pid]
            elif self.zygote.process.poll() is not None:  # the zygote is gone: its children are ours now
                self.returncode = _orphan_code(self.pid)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            _kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0)
            select.select([self.zygote._answers], [], [], POLL_S)
        return code


def _kill(pid: int, signum: int = signal.SIGKILL) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _orphan_code(pid: int) -> int | None:
    """The code of a child whose zygote died: reparented to this process where it is PID 1 (a
    container's), else to an init that reaps it; None while it runs."""
    try:
        found, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return -signal.SIGKILL  # ended, its code lost with the zygote
        return None
    return os.waitstatus_to_exitcode(status) if found else None


def serve(answer_fd: int, run: Callable[[str | None, list[str]], int]) -> int:
    """The zygote process: imports, says it is ready, then forks a child per request until its stdin
    closes, saying each child's pid and, when it ends, its code. `run`: the rank's entrypoint
    (entrypoint.run, handed in by __main__, which the supervisor's modules may not import)."""
    for module in IMPORTS:
        try:
            importlib.import_module(module)
        except ImportError:
            pass
    _warm()
    answers = os.fdopen(answer_fd, "wb", buffering=0)

    def say(answer: Mapping[str, Any]) -> None:
        answers.write(json.dumps(answer).encode() + b"\n")

    say({"ready": True})
    pending = b""
    while True:
        readable, _, _ = select.select([0], [], [], POLL_S)
        if readable:
            chunk = os.read(0, 1 << 20)
            if not chunk:
                return 0
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    _child(request["target"], request["args"], request["env"], answer_fd, run)
                say({"pid": pid})
        _reap(say)


def _warm() -> None:
    """Parses the S3 client's service model, which the ranks forked from here then share (0.1 s each):
    a client itself does not cross fork (s3.client() makes each process its own)."""
    try:
        from ..storage import s3

        s3.client()
    except Exception:  # noqa: BLE001 - a rank that uses S3 says itself what is wrong with its settings
        pass


def _reap(say: Any) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        say({"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def _child(target: str | None, args: Sequence[str], environ: Mapping[str, str], answer_fd: int,
           run: Callable[[str | None, list[str]], int]) -> None:
    """In the forked child: become the rank process `python -m ddp_trainer run <target> -- <args>`."""
    code = 70
    try:
        os.close(answer_fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.environ.clear()
        os.environ.update(environ)
        sys.argv = [sys.argv[0], "run", *([target] if target else []), "--", *args]
        numpy = sys.modules.get("numpy")
        if numpy is not None:  # seeded once, at the zygote's import; a process started anew seeds its own
            numpy.random.seed()
        from .process_exit import exit_process

        exit_process(run(target, list(args)))
    except BaseException as exc:  # noqa: BLE001 - the child must never return into the zygote's loop
        print(f"ddp-trainer: a rank process forked by the zygote failed to start: {exc!r}", file=sys.stderr, flush=True)
    finally:
        os._exit(code)
