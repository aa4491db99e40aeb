"""A pod that holds several ranks (the job's ranksPerPod): one process per local rank, as torchrun
starts them, supervised so the pod fails as a rank would.

The operator gives such a pod WORLD_SIZE (every rank of the job), LOCAL_WORLD_SIZE (the ranks in
this pod) and NODE_RANK/GROUP_RANK (the pod's index), but no RANK: `python -m ddp_trainer run`
then starts LOCAL_WORLD_SIZE copies of itself with RANK = NODE_RANK x LOCAL_WORLD_SIZE + LOCAL_RANK
and LOCAL_RANK (which pins cuda:LOCAL_RANK). When one fails, the others get a moment to fail on
their own (their collectives break), then are stopped; the pod exits with the failing rank's code
and leaves its termination message, so the operator classifies the failure as for a one-rank pod.
"""

from __future__ import annotations

import logging
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ddp_contract import envnames as names
from ddp_contract.exitcodes import ExitCode

from .. import env
from ..errors import ConfigError
from .folderkeeper import kept_ranks
from .rankprocesses import RankProcesses
from .termination import leave_termination_message
from .zygote import ForkedProcess, Zygote

log = logging.getLogger(__name__)

# After the first rank of the pod fails, how long the others may take to fail on their own.
PEER_GRACE_SECONDS = 10.0
STOP_GRACE_SECONDS = 5.0
POLL_SECONDS = 0.05


def is_launcher(environ: Mapping[str, str]) -> bool:
    """A pod of several ranks, before they are started (LOCAL_WORLD_SIZE > 1 and no RANK yet), or of
    one rank that keeps folders (DDP_KEEP_FOLDERS, which its rank process is not given): this process
    then supervises the rank processes, keeping the folders while they run."""
    several = not environ.get(names.RANK, "").strip() and env.local_world_size(environ) > 1
    return several or bool(environ.get(names.KEEP_FOLDERS, "").strip())


def local_rank_env(environ: Mapping[str, str], local_rank: int, message_path: str) -> dict[str, str]:
    """One local rank's environment, with torchrun's names."""
    per_pod = env.local_world_size(environ)
    node = env.node_rank(environ)
    world = int(environ.get(names.WORLD_SIZE) or 0)
    rank = node * per_pod + local_rank
    if rank >= world:
        raise ConfigError(f"{names.NODE_RANK}={node} x {names.LOCAL_WORLD_SIZE}={per_pod} + {local_rank} "
                          f"is not below {names.WORLD_SIZE}={world}")
    child = {key: value for key, value in environ.items() if key != names.KEEP_FOLDERS}  # the pod keeps them
    return {**child, names.RANK: str(rank), names.LOCAL_RANK: str(local_rank), names.GROUP_RANK: str(node),
            names.TERMINATION_MESSAGE_PATH: message_path}


@dataclass
class LocalRank:
    local_rank: int
    process: subprocess.Popen[bytes] | ForkedProcess
    message_path: Path
    exit_code: int | None = None
    ended_at: float | None = None


def launch(target: str | None, args: Sequence[str], environ: Mapping[str, str]) -> int:
    """Start every local rank, wait for them, and return the pod's exit code."""
    with LocalRanks(target, args, environ) as ranks:
        if run_once(ranks, environ):
            return ExitCode.TERMINATED
        code, message = ranks.outcome()
        if message:  # the cause wrote one: it becomes the pod's
            leave_termination_message(message)
        return code


def run_once(ranks: RankProcesses, environ: Mapping[str, str]) -> bool:
    """Start the pod's rank processes and supervise them until they end, a SIGTERM the container gets
    passed on to them (and SIGKILL after STOP_GRACE_SECONDS); True when a SIGTERM stopped them."""
    ranks = kept_ranks(ranks, environ)
    stopping: list[int] = []

    def forward(signum: int, frame: object) -> None:
        stopping.append(signum)
        ranks.signal_all(signum)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        ranks.start(environ)
        ranks.supervise(lambda: bool(stopping))
    finally:
        signal.signal(signal.SIGTERM, previous)
    return bool(stopping)


class LocalRanks:
    """The rank processes of one pod for one attempt: started, supervised, their outcome judged.
    A context manager: whatever still runs when it is left is killed."""

    def __init__(self, target: str | None, args: Sequence[str], environ: Mapping[str, str]) -> None:
        self.command = [sys.executable, "-m", "ddp_trainer", "run", *([target] if target else []), "--", *args]
        self.target, self.args = target, list(args)
        self.count = env.local_world_size(environ)
        self.ranks: list[LocalRank] = []
        self.zygote: Zygote | None = None
        self._messages = Path(tempfile.mkdtemp(prefix="ddp-local-ranks-"))

    def __enter__(self) -> LocalRanks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
        if self.zygote is not None:
            self.zygote.close()
        shutil.rmtree(self._messages, ignore_errors=True)

    def prepare_zygote(self, environ: Mapping[str, str]) -> None:
        """Start the pod's zygote (once): later attempts' rank processes are forked from it, their
        imports done."""
        if self.zygote is None:
            self.zygote = Zygote(environ)

    def start(self, environ: Mapping[str, str]) -> None:
        """Start the pod's ranks with `environ` (each with its own RANK, LOCAL_RANK and message file)."""
        self.kill()
        self.ranks = []
        for local_rank in range(self.count):
            path = self._messages / f"rank-{local_rank}"
            path.write_bytes(b"")
            child_env = local_rank_env(environ, local_rank, str(path))
            forked = self.zygote.fork(self.target, self.args, child_env) if self.zygote is not None else None
            self.ranks.append(LocalRank(local_rank, forked or subprocess.Popen(self.command, env=child_env), path))
        first = env.node_rank(environ) * self.count  # the attempt's: an elastic gang places the pod anew
        warm = sum(isinstance(r.process, ForkedProcess) for r in self.ranks)
        log.info("started %d local rank%s (global %s)%s", len(self.ranks), "s" if len(self.ranks) > 1 else "",
                 ", ".join(str(first + r.local_rank) for r in self.ranks), f", {warm} forked by the zygote" if warm else "")

    def supervise(self, interrupted: Callable[[], bool] = lambda: False) -> bool:
        """Wait until every rank has ended; once one failed (or `interrupted()` says so), stop the
        others: after PEER_GRACE_SECONDS for a failure, at once for an interruption. True when the
        ranks were stopped because of an interruption."""
        first_failure: float | None = None
        stopping_since: float | None = None
        was_interrupted = False
        while any(r.exit_code is None for r in self.ranks):
            now = time.monotonic()
            for rank in self.ranks:
                if rank.exit_code is None and (code := rank.process.poll()) is not None:
                    rank.exit_code = 128 - code if code < 0 else code  # killed by signal N: 128+N
                    rank.ended_at = now
                    if rank.exit_code != 0 and first_failure is None:
                        first_failure = now
            if stopping_since is None and interrupted():
                was_interrupted = True
                stopping_since = now
                self.signal_all(signal.SIGTERM)
            if first_failure is not None and stopping_since is None and now - first_failure > PEER_GRACE_SECONDS:
                stopping_since = now
                self.signal_all(signal.SIGTERM)
            if stopping_since is not None and now - stopping_since > STOP_GRACE_SECONDS:
                self.signal_all(signal.SIGKILL)
            time.sleep(POLL_SECONDS)
        return was_interrupted

    def signal_all(self, signum: int) -> None:
        for rank in self.ranks:
            if rank.exit_code is None and rank.process.poll() is None:
                rank.process.send_signal(signum)

    def kill(self) -> None:
        for rank in self.ranks:
            if rank.process.poll() is None:
                rank.process.kill()
                rank.process.wait()

    def pids(self) -> list[int]:
        return [rank.process.pid for rank in self.ranks]

    def outcome(self) -> tuple[int, str]:
        """0 when every local rank succeeded; else the cause's code and last words (its termination
        message): the first rank to fail for a reason of its own, before one whose collective broke
        because a peer died."""
        failed = [r for r in self.ranks if r.exit_code]
        if not failed:
            return ExitCode.OK, ""
        cause = min(failed, key=lambda r: (r.exit_code == ExitCode.COMMUNICATION_ERROR, r.ended_at or 0.0,
                                           r.local_rank))
        message = cause.message_path.read_text(errors="replace") if cause.message_path.exists() else ""
        return int(cause.exit_code or ExitCode.USER_ERROR), message
