"""A job's `command` under the trainer runtime: `ddp-trainer exec -- CMD [ARGS...]`, the container's
command when the image has the runtime (the operator's shell line looks for it).

The command runs as the pod's rank processes would: a program that is one rank runs under
`torchrun --no-python` when the pod holds several, a launcher (torchrun, accelerate launch) starts them
itself from the pod's PET_* settings. Around it, as around an entrypoint's ranks: its output goes on to
the container's and is kept in S3 (logkeeper), its metric lines and progress bars drive the job's
progress and metrics (printedmetrics), a hang watch on that progress, and, where it fails, the failure
line and last words the operator reads. Inside its Python processes, runtime/inprocess.py checks the
world every process group forms, says when rank 0's formed and how a process failed.

`run` is restartStrategy Recreate: one attempt, the container's exit code. Under InPlace,
runtime/inplace.py starts the same CommandProcess for each attempt.
"""

from __future__ import annotations

import json
import logging
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from ddp_contract import api, commands
from ddp_contract import envnames as names
from ddp_contract.exitcodes import ExitCode, is_retryable_exit
from ddp_contract.failureline import describe_hang, format_line, parse_line

from .. import env
from ..errors import ConfigError
from ..storage import s3
from . import logkeeper
from .formed import record_formed
from .hangwatch import Hang, HangWatch, save_dump
from .heartbeat import HEARTBEAT, Heartbeat
from .inprocess import LAUNCHER_ERRORS
from .logkeeper import Listener, LogKeeper, make_keeper
from .printedmetrics import PrintedMetrics
from .rankexit import last_words
from .supervisor import run_once
from .termination import leave_termination_message

log = logging.getLogger(__name__)

HOOK_DIR = Path(__file__).parent / "hook"
STOP_GRACE_SECONDS = 5.0  # SIGTERM to SIGKILL, for the command's processes
ORPHAN_GRACE_SECONDS = 2.0  # after the command ended, for what it left running in its session
POLL_SECONDS = 0.05
STACKS_WAIT_SECONDS = 3.0  # a hang: how long the processes have to print their stacks
TAIL_BYTES = 64 * 1024
PROGRESS_SOCKET = "progress.sock"
PROBE_WAIT_SECONDS = 1.0  # how long a trainer's message may wait for room in the progress queue
SCRIPT_BYTES = 64 * 1024


def launch_argv(command: Sequence[str], environ: Mapping[str, str]) -> list[str]:
    """What the pod runs for `command` in the attempt `environ` names: under torchrun, given the
    attempt's world on its command line, when it is one rank of a pod of several."""
    if not command:
        raise ConfigError("no command: `ddp-trainer exec -- CMD [ARGS...]`")
    if not wrapped(command, environ):
        return list(command)
    torchrun = shutil.which("torchrun", path=environ.get("PATH"))
    flags = [f"--nnodes={environ.get(names.PET_NNODES, '1')}", f"--nproc-per-node={env.local_world_size(environ)}",
             f"--node-rank={environ.get(names.PET_NODE_RANK, '0')}",
             f"--master-addr={environ.get(names.PET_MASTER_ADDR, environ.get(names.MASTER_ADDR, '127.0.0.1'))}",
             f"--master-port={environ.get(names.PET_MASTER_PORT, environ.get(names.MASTER_PORT, '29500'))}"]
    return [*([torchrun] if torchrun else [sys.executable, "-m", "torch.distributed.run"]), *flags, "--no-python",
            *command]


def wrapped(command: Sequence[str], environ: Mapping[str, str]) -> bool:
    """Whether `command` runs under torchrun here: a program that is one rank, in a pod of several, that
    does not start them itself (spec.launcher Command: mp.spawn)."""
    kind = commands.command_kind(command, read=_read_script)
    starts_ranks = environ.get(names.LAUNCHER) == api.LAUNCHER_COMMAND
    return kind == commands.PROGRAM and not starts_ranks and env.local_world_size(environ) > 1


def _read_script(path: str) -> str | None:
    try:
        with open(path, errors="replace") as f:
            return f.read(SCRIPT_BYTES)
    except OSError:
        return None


def command_env(environ: Mapping[str, str], folder: Path, under_torchrun: bool = False) -> dict[str, str]:
    """The command's environment: the attempt's, with the in-process hook first on PYTHONPATH and where
    its processes say how they failed and that the group formed. Under the runtime's torchrun, whose
    command line says the job's world, without torchrun's settings: a launcher the program starts in
    turn then forms a world of its own, which the hook refuses at once, rather than one more of the job's."""
    child = {k: v for k, v in environ.items() if not (under_torchrun and k in names.PET_NAMES)}
    child[names.GANG_WORLD_SIZE] = environ.get(names.WORLD_SIZE, "")
    child[names.FAILURE_DIR] = str(folder / "failures")
    child[names.FORMED_FILE] = str(folder / "formed.json")
    if env.metrics_from_output(environ):
        child[names.PROGRESS_SOCKET] = str(folder / PROGRESS_SOCKET)
    child["PYTHONPATH"] = os.pathsep.join(p for p in (str(HOOK_DIR), environ.get("PYTHONPATH", "")) if p)
    child.setdefault("PYTHONUNBUFFERED", "1")  # a pipe would hold prints back from the log and the progress
    return child


class Tail:
    """The end of the command's output (a LogKeeper listener), for its last words and a hang's stacks."""

    def __init__(self, size: int = TAIL_BYTES) -> None:
        self.size = size
        self._data = bytearray()
        self._total = 0
        self._lock = threading.Lock()

    def feed(self, data: bytes, stream: int = 1) -> None:
        with self._lock:
            self._data += data
            self._total += len(data)
            del self._data[:-self.size]

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    def mark(self) -> int:
        with self._lock:
            return self._total

    def text(self, since: int = 0) -> str:
        with self._lock:
            keep = max(0, min(len(self._data), self._total - since))
            return bytes(self._data[len(self._data) - keep:]).decode("utf-8", errors="replace")


class Activity:
    """Output ticks the hang watch's clock once progress started it (a LogKeeper listener): a command
    is watched from its first recognised progress on, as an entrypoint's rank from its first step."""

    def __init__(self, heartbeat: Heartbeat) -> None:
        self.heartbeat = heartbeat

    def feed(self, data: bytes, stream: int = 1) -> None:
        if self.heartbeat.step is not None:
            self.heartbeat.tick()

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


_TRACEBACK = "Traceback (most recent call last):"
_PREFIX = re.compile(r"^\[[^\]]{1,40}\]:\s?")  # torchrun's and torch's per-rank prefixes: "[rank1]: ", "[default0]:"


def last_error(output: str) -> str:
    """The error a failed command's output ends with: the last line of its last traceback that is not a
    launcher's report of a child's failure, else its last line."""
    lines = [_PREFIX.sub("", line).rstrip() for line in output.replace("\r", "\n").splitlines()]
    found = ""
    for index, line in enumerate(lines):
        if line.strip() == _TRACEBACK:
            error = next((later for later in lines[index + 1:] if later and not later[0].isspace()), "")
            if error and not any(name in error.split(":")[0] for name in LAUNCHER_ERRORS):
                found = error
    if found:
        return found
    return next((line.strip() for line in reversed(lines) if line.strip()), "the command printed nothing")


def code_name(code: int) -> str:
    """A name for an exit code in the failure line."""
    if code in ExitCode._value2member_map_:
        return ExitCode(code).name
    if code > 128:
        try:
            return signal.Signals(code - 128).name
        except ValueError:
            pass
    return "EXIT"


class CommandProcess:
    """The command in this pod, started for one attempt after another (`start`), supervised until it
    ends or is stopped (`supervise`), its failure judged (`outcome`). A context manager: whatever still
    runs when it is left is killed."""

    def __init__(self, command: Sequence[str], environ: Mapping[str, str]) -> None:
        self.command = list(command)
        self.argv = launch_argv(command, environ)
        self.count = env.local_world_size(environ)  # the pod's ranks, whoever starts them
        self.process: subprocess.Popen[bytes] | None = None
        self.keeper: LogKeeper | None = None
        self.tail = Tail()
        self.activity = Heartbeat()
        self.rank = 0
        self.attempt = 0
        self._folder = Path(tempfile.mkdtemp(prefix="ddp-command-"))
        self._watch: HangWatch | None = None
        self._started = 0.0
        self._code: int | None = None
        self._outcome: tuple[int, str] = (ExitCode.OK, "")
        self._hung: str | None = None
        self._formed = False
        self._printed: PrintedMetrics | None = None  # the attempt's, where the probes' messages go
        self._probes = _listen(self._folder / PROGRESS_SOCKET)
        self._probes_taken = threading.Lock()  # the reader's, or the attempt's end's, which reads what is left
        self._closed = threading.Event()
        self._probe_reader = threading.Thread(target=self._read_probes, name="ddp-progress-probes", daemon=True)
        self._probe_reader.start()

    def __enter__(self) -> CommandProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
        self._closed.set()
        self._probe_reader.join()
        self._probes.close()
        shutil.rmtree(self._folder, ignore_errors=True)

    def _read_probes(self) -> None:
        """The in-process hook's progress messages, to the attempt's PrintedMetrics."""
        while not self._closed.is_set():
            ready, _, _ = select.select([self._probes], [], [], POLL_SECONDS * 4)
            if ready:
                self._take_probes()

    def _take_probes(self) -> None:
        """Every message the socket holds, to the attempt's PrintedMetrics. Once the command ended, all
        it sent is there: a datagram is queued at the receiver when its sendto returns."""
        with self._probes_taken:
            while True:
                try:
                    data = self._probes.recv(65536)
                except (BlockingIOError, InterruptedError):
                    return
                printed = self._printed
                if printed is not None:
                    try:
                        printed.probe(json.loads(data), wait_s=PROBE_WAIT_SECONDS)
                    except ValueError:
                        pass

    def prepare_zygote(self, environ: Mapping[str, str]) -> None:
        """A command is started anew for each attempt: there is nothing to fork it from."""

    def start(self, environ: Mapping[str, str]) -> None:
        """Start the command for the attempt `environ` names (DDP_ATTEMPT; its gang's size and place)."""
        self.kill()
        shutil.rmtree(self._folder / "failures", ignore_errors=True)
        (self._folder / "failures").mkdir(parents=True)
        (self._folder / "formed.json").unlink(missing_ok=True)
        self.attempt = env.JobInfo.from_env(environ).attempt
        self.rank = env.node_rank(environ) * self.count
        self._code, self._outcome, self._hung, self._formed = None, (ExitCode.OK, ""), None, False
        HEARTBEAT.reset()
        self.activity.reset()
        self.argv = launch_argv(self.command, environ)  # the attempt's world: an elastic gang places the pod anew
        child_env = command_env(environ, self._folder, under_torchrun=wrapped(self.command, environ))
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        try:
            self.process = subprocess.Popen(self.argv, env=child_env, stdin=subprocess.DEVNULL,
                                            stdout=out_write, stderr=err_write, start_new_session=True)
        except OSError as error:
            for fd in (out_read, out_write, err_read, err_write):
                os.close(fd)
            raise ConfigError(f"the command {commands.describe(self.argv)} cannot be started: {error}") from error
        os.close(out_write)
        os.close(err_write)
        self._started = time.time()
        extra: list[Listener] = [self.tail, Activity(self.activity)]
        keeper = make_keeper(self.rank, environ, extra, self.activity) or LogKeeper(None, 0, listeners=extra)
        if keeper.upload is not None:
            _warm_s3_client()
        self._printed = PrintedMetrics.among(keeper.listeners)
        self.keeper = keeper.attach([(out_read, 1), (err_read, 2)])
        self._watch = HangWatch(self.activity, env.hang_timeout_s(environ), env.hang_min_s(environ), self._on_hang).start()
        log.info("attempt %d: started %s (pid %d)%s", self.attempt, commands.describe(self.argv), self.process.pid,
                 f" for ranks {self.rank}-{self.rank + self.count - 1}" if self.count > 1 else f" as rank {self.rank}")

    def supervise(self, interrupted: Callable[[], bool] = lambda: False) -> bool:
        """Wait until the command ends; stop it when `interrupted()` says so. True when it was stopped."""
        process = self.process
        if process is None:
            return False
        stopping_since: float | None = None
        while (code := process.poll()) is None:
            now = time.monotonic()
            if stopping_since is None and interrupted():
                stopping_since = now
                self.signal_all(signal.SIGTERM)
            if stopping_since is not None and now - stopping_since > STOP_GRACE_SECONDS:
                self.signal_all(signal.SIGKILL)
            self._report_formed()
            time.sleep(POLL_SECONDS)
        self._end_session(process.pid)
        self._code = 128 - code if code < 0 else code
        self._report_formed()
        ended = stopping_since is None and self._hung is None
        self._take_probes()  # the trainer's last messages, before the output's readers close
        if ended and self._code == ExitCode.OK and self._printed is not None:
            self._printed.succeeded()
        self._finish(logkeeper.ENDED_UPLOAD_SECONDS if ended else logkeeper.FINAL_UPLOAD_SECONDS)
        if stopping_since is None and self._code != ExitCode.OK:
            self._outcome = self._judge(self._code)
            print(self._outcome[1].splitlines()[-1], file=sys.stderr, flush=True)
        return stopping_since is not None

    def pids(self) -> list[int]:
        """The command's first process (a launcher's workers are its children)."""
        return [self.process.pid] if self.process is not None else []

    def outcome(self) -> tuple[int, str]:
        """0 when the command succeeded; else the exit code the pod reports and its last words."""
        return self._outcome

    def signal_all(self, signum: int) -> None:
        """`signum` to every process of the command (its session), the launcher's workers included."""
        if self.process is not None and self.process.poll() is None:
            _signal_group(self.process.pid, signum)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            _signal_group(self.process.pid, signal.SIGKILL)
            self.process.wait()
            self._end_session(self.process.pid)
        self._finish()

    def _finish(self, upload_s: float = logkeeper.FINAL_UPLOAD_SECONDS) -> None:
        if self._watch is not None:
            self._watch.stop()
            self._watch = None
        if self.keeper is not None:
            self.keeper.finish(upload_s)
            self.keeper = None
        self._printed = None

    def _end_session(self, pid: int) -> None:
        """What the command left running in its session (a worker its launcher lost) is stopped, so its
        output ends and the next attempt starts alone."""
        deadline = time.monotonic() + ORPHAN_GRACE_SECONDS
        while _group_alive(pid) and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
        if _group_alive(pid):
            _signal_group(pid, signal.SIGKILL)

    def _judge(self, code: int) -> tuple[int, str]:
        if self._hung is not None:
            return ExitCode.HUNG, self._hung
        recorded = self._recorded_failure()
        if recorded is not None:
            return recorded
        output = self.tail.text()
        before = "\n".join(output.rstrip().splitlines()[-5:])
        line = format_line(self.rank, HEARTBEAT.step, code, code_name(code), is_retryable_exit(code), last_error(output))
        return code, f"{before}\n{line}" if before else line

    def _recorded_failure(self) -> tuple[int, str] | None:
        """The failure a process of the command recorded (inprocess.py): the first to fail for a reason of
        its own, before one whose collective broke because a peer died."""
        found = []
        for path in (self._folder / "failures").glob("*.txt"):
            text = path.read_text(errors="replace")
            line = parse_line(text)
            if line is not None:
                found.append((line.exit_code == ExitCode.COMMUNICATION_ERROR, path.stat().st_mtime, line, text))
        if not found:
            return None
        _, _, line, text = min(found, key=lambda item: (item[0], item[1]))
        if line.step is None and HEARTBEAT.step is not None:  # the process knew no step; its output did
            said = format_line(line.rank, HEARTBEAT.step, line.exit_code, code_name(line.exit_code),
                               is_retryable_exit(line.exit_code), line.error)
            text = "\n".join([*text.rstrip().splitlines()[:-1], said])
        return line.exit_code, text.rstrip()

    def _report_formed(self) -> None:
        """Rank 0's process group formed: into the job's status.rendezvous, once an attempt."""
        path = self._folder / "formed.json"
        if self._formed or self.rank != 0 or not path.exists():
            return
        self._formed = True
        try:
            formed = json.loads(path.read_text())
        except (OSError, ValueError):
            return
        took = max(0.0, float(formed.get("time", self._started)) - self._started)
        log.info("attempt %d: rank 0's process group formed %.2fs after the command started", self.attempt, took)
        threading.Thread(target=record_formed, args=(self.attempt, took, None), daemon=True).start()

    def _on_hang(self, hang: Hang) -> None:
        """The hang watch's: every Python process prints its stacks (SIGUSR1), they go to S3, and the
        command is ended HUNG."""
        mark = self.tail.mark()
        asked = self._ask_for_stacks()
        time.sleep(STACKS_WAIT_SECONDS if asked else 0)
        stacks = self.tail.text(since=mark) or "(no Python process printed its stacks)"
        where = save_dump(self.rank, self.attempt, stacks, None)
        error = f"{describe_hang(HEARTBEAT.step, hang.stalled_s, hang.timeout_s)}; stacks in {where}"
        self._hung = format_line(self.rank, HEARTBEAT.step, int(ExitCode.HUNG), ExitCode.HUNG.name, True, error)
        self.signal_all(signal.SIGKILL)

    def _ask_for_stacks(self) -> int:
        """SIGUSR1 to each process of the command that handles it (inprocess.py's faulthandler); the
        others would die of it. How many were asked."""
        if self.process is None:
            return 0
        asked = 0
        for pid in _session_pids(self.process.pid):
            if _catches(pid, signal.SIGUSR1):
                try:
                    os.kill(pid, signal.SIGUSR1)
                    asked += 1
                except ProcessLookupError:
                    pass
        return asked


def run(command: Sequence[str], environ: Mapping[str, str]) -> int:
    """restartStrategy Recreate: run the command once; the container's exit code."""
    with CommandProcess(command, environ) as process:
        if run_once(process, environ):
            last_words(ExitCode.TERMINATED, process.rank, "stopped by SIGTERM (pod deleted, node drained or job preempted)")
            return ExitCode.TERMINATED
        code, message = process.outcome()
        if code != ExitCode.OK:
            leave_termination_message(message)
        return code


def _listen(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.setblocking(False)
    return sock


def _warm_s3_client() -> None:
    """Make this process's S3 client while the command runs, so the log's last upload at its end does
    not also import boto3 and build one (seconds on a busy node). A failure shows at that upload."""
    def make() -> None:
        try:
            s3.client()
        except Exception:  # noqa: BLE001 - the upload names what is wrong
            pass

    threading.Thread(target=make, name="ddp-s3-client", daemon=True).start()


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _session_pids(sid: int) -> list[int]:
    """The processes of session `sid` (the command started it), from /proc."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if len(fields) > 3 and int(fields[3]) == sid:  # the session id: stat's 6th field, the 4th after the name
                pids.append(int(entry))
    return pids


def _catches(pid: int, signum: int) -> bool:
    """Whether process `pid` has a handler for `signum` (/proc's SigCgt mask)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError):
        pass
    return False
