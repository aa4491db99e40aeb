"""restartStrategy InPlace: the container's runtime supervises the pod's rank processes across gang
attempts, so a restart reschedules only the pods that cannot go on.

The loop, in the container's first process:
  start the pod's rank processes for the job's attempt (DDP_ATTEMPT, DDP_RESUME_FROM from its status)
  when the job's status.attempt passes theirs: stop them (their gang is being re-formed), start again
  when one fails: report it in status.processFailures (the operator reads it as a failed container's
    exit) and wait for the next attempt; where it cannot be reported, or the job fails with it, exit
    with its code (and its last words as the termination message), as a failed container does
  when they all succeed: exit 0
  SIGTERM (the pod deleted): stop them and exit TERMINATED
An elastic job's status names each attempt's gang (status.members, pod indices in rank order): a
member's rank processes get the gang's WORLD_SIZE and ranks, and rank 0's pod as MASTER_ADDR; a pod
that is not a member starts none and waits for an attempt that takes it in (or the job's end). A job's
spare pods (spec.sparePods; indices past the gang's) are never members at first: they wait so, with
their zygote started, and a restart that loses a member's pod puts one in its place.
Every attempt is marked in the container's output, so `kubectl logs` shows them in order. Once an
attempt's gang has formed the pod starts its zygote (runtime/zygote.py): the next attempt's rank
processes are forked from it, torch and the runtime already imported.
"""

from __future__ import annotations

import logging
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from ddp_contract import api
from ddp_contract import envnames as names
from ddp_contract.exitcodes import SIGKILL_EXIT, ExitCode
from ddp_contract.jobstatus import STATUS_PROCESS_FAILURES
from ddp_contract.timestamps import rfc3339

from .. import env
from ..jobstatus import JobStatusSink
from ..jobwatch import JobView, JobWatch
from ..storage.podsnapshots import PodSnapshots
from .context import target_world_size
from .folderkeeper import kept_ranks
from .rankprocesses import RankProcesses
from .termination import leave_termination_message

log = logging.getLogger(__name__)

FINAL_PHASES = frozenset({"Succeeded", "Failed"})
REPORT_TRIES_S = 30.0  # how long a failed rank process's report is tried before the container ends instead
# How long the runtime waits at start for the job's status, before it goes on with the pod's own env.
FIRST_VIEW_WAIT_S = 30.0
# Where the kernel counts OOM kills of the container's cgroup (v2, then v1).
OOM_COUNTERS = (Path("/sys/fs/cgroup/memory.events"), Path("/sys/fs/cgroup/memory/memory.oom_control"))
_OOM_KILL = re.compile(r"^oom_kill (\d+)$", re.MULTILINE)


def is_in_place(environ: Mapping[str, str]) -> bool:
    """The container's first process of an InPlace job (not a rank process it started)."""
    return environ.get(names.RESTART_STRATEGY) == api.RESTART_IN_PLACE and not environ.get(names.SUPERVISED)


def oom_kills(counters: Sequence[Path] = OOM_COUNTERS) -> int | None:
    """The OOM kills the kernel counted in this container's memory cgroup; None where it says none."""
    for path in counters:
        try:
            found = _OOM_KILL.search(path.read_text())
        except OSError:
            continue
        if found:
            return int(found.group(1))
    return None


def failure_report(attempt: int, exit_code: int, message: str, oom_killed: bool, now: float) -> dict[str, object]:
    """One status.processFailures entry: what the kubelet would have said of the container's exit."""
    reason = "OOMKilled" if oom_killed else "Error"
    return {"attempt": attempt, "exitCode": exit_code, "reason": reason, "message": message[-4096:],
            "finishedAt": rfc3339(now)}


def gang_env(environ: Mapping[str, str], members: Sequence[int], index: int) -> dict[str, str]:
    """What the pod's env (made for the job's full size) becomes in the gang `members` (pod indices
    in rank order), for the member pod `index`: the gang's WORLD_SIZE, the pod's place in it as its
    NODE_RANK (and RANK or GROUP_RANK, as the pod env has them), and rank 0's pod as MASTER_ADDR; and
    torchrun's settings alike (PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR) for a launcher."""
    if index not in members:
        raise ValueError(f"pod {index} is not in the gang {list(members)}")
    place = str(members.index(index))
    changed = {names.WORLD_SIZE: str(len(members) * env.local_world_size(environ)), names.NODE_RANK: place,
               names.PET_NNODES: str(len(members)), names.PET_NODE_RANK: place}
    changed[names.RANK if environ.get(names.RANK, "").strip() else names.GROUP_RANK] = place
    job_name = environ.get(names.JOB_NAME, "").strip()
    master = environ.get(names.MASTER_ADDR, "")
    first_pod = f"{job_name}-0."
    if job_name and master.startswith(first_pod):  # else not the operator's name (a harness's 127.0.0.1): kept
        changed[names.MASTER_ADDR] = changed[names.PET_MASTER_ADDR] = f"{job_name}-{members[0]}.{master[len(first_pod):]}"
    return changed


def attempt_env(environ: Mapping[str, str], view: JobView | None, attempt: int) -> dict[str, str]:
    """The rank processes' environment for `attempt`: the pod's, with the attempt and the checkpoint
    the job's status holds now (a pod's own DDP_RESUME_FROM is the one when it was created), in the
    gang the status names (elastic jobs; this pod must be a member)."""
    child = {**environ, names.SUPERVISED: "1", names.ATTEMPT: str(attempt)}
    if view is not None and view.checkpoint:
        child[names.RESUME_FROM] = view.checkpoint
    if view is not None and view.members is not None:
        child.update(gang_env(environ, view.members, env.node_rank(environ)))
    return child


class CheckpointRequest:
    """The file that tells the rank processes the job asks for a checkpoint (status.checkpointRequested):
    it holds the request's time while there is one, and is gone otherwise."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._written: str | None = None

    def sync(self, view: JobView | None) -> None:
        wanted = view.checkpoint_requested if view is not None else None
        if wanted == self._written:
            return
        if wanted is None:
            self.path.unlink(missing_ok=True)
        else:
            fresh = self.path.with_suffix(".new")
            fresh.write_text(wanted)
            fresh.replace(self.path)  # a reader sees the old request or the new one, never half of it
        self._written = wanted


def _sizes(world_size: int, target: int) -> str:
    return f"world size {world_size} of {target}"


def serve(ranks: RankProcesses, environ: Mapping[str, str]) -> int:
    """Run the pod's ranks (an entrypoint's LocalRanks, a command's CommandProcess) attempt after
    attempt; the container's exit code."""
    job = env.JobInfo.from_env(environ)
    ranks = kept_ranks(ranks, environ)
    watch = JobWatch(job.namespace, job.name).start()
    folder = Path(tempfile.mkdtemp(prefix="ddp-in-place-"))
    try:
        with ranks:
            request = CheckpointRequest(folder / "checkpoint-request")
            return Attempts(ranks, environ, job, watch, JobStatusSink(job.namespace, job.name), request).run()
    finally:
        watch.stop()
        shutil.rmtree(folder, ignore_errors=True)


class Attempts:
    """The pod's rank processes, attempt after attempt of the job (the module's docstring)."""

    def __init__(self, ranks: RankProcesses, environ: Mapping[str, str], job: env.JobInfo, watch: JobWatch,
                 sink: JobStatusSink, request: CheckpointRequest) -> None:
        self.ranks = ranks
        self.environ = environ
        self.watch = watch
        self.sink = sink
        self.request = request
        self.index = env.node_rank(environ)
        self.target_size = target_world_size(environ, int(environ.get(names.WORLD_SIZE) or 0))
        self.gang_pods = self.target_size // max(self.ranks.count, 1)
        self.attempt = job.attempt
        self.stopping: list[int] = []  # the signals the pod was stopped with

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._stop)
        first = self.watch.wait(lambda v: True, FIRST_VIEW_WAIT_S)
        self.attempt = max(self.attempt, first.attempt if first else 0)
        while (code := self._next()) is None:
            pass
        return code

    def _stop(self, signum: int, frame: object) -> None:
        self.stopping.append(signum)
        self.ranks.signal_all(signum)

    def _next(self) -> int | None:
        """This pod's part in the job's current attempt: the container's exit code once it is to end,
        else None (go on with the next attempt)."""
        view = self.watch.view  # one view for the attempt: its number, its gang and this pod's env in it
        self.attempt = max(self.attempt, view.attempt if view else 0)
        members = view.members if view is not None else None
        if members is None and self.index >= self.gang_pods:  # a spare, the job's status not yet read
            members = tuple(range(self.gang_pods))
        if members is not None and self.index not in members:
            size = len(members) * self.ranks.count
            _mark(f"attempt {self.attempt}: " + ("this pod is a spare; waiting to take the place of a pod the gang loses"
                                                 if size == self.target_size else
                                                 f"this pod is not in the gang ({_sizes(size, self.target_size)}); "
                                                 "waiting for an attempt that takes it in"))
            # The gang goes on without this pod's memory snapshots: taken in again, it must not offer them.
            PodSnapshots(env.snapshot_dir(self.environ)).clear()
            self.ranks.prepare_zygote(self.environ)  # taken in, its ranks are forked with their imports done
            return _wait_out(self.watch, self.attempt, self.stopping)
        return self._train(view)

    def _train(self, view: JobView | None) -> int | None:
        """Start the rank processes for the attempt and see them out: interrupted by the next attempt
        (None), ended (0), failed (_failed), or the pod stopped."""
        child_env = {**attempt_env(self.environ, view, self.attempt), names.CHECKPOINT_REQUEST_FILE: str(self.request.path)}
        size = int(child_env.get(names.WORLD_SIZE) or 0)
        resized = f" ({_sizes(size, self.target_size)})" if size != self.target_size else ""
        _mark(f"attempt {self.attempt}: starting the rank process{'es' if self.ranks.count > 1 else ''} in place{resized}")
        ooms = oom_kills()
        self.ranks.start(child_env)
        interrupted = self.ranks.supervise(self._interrupted)
        if self.stopping:
            return ExitCode.TERMINATED
        if interrupted:
            _mark(f"attempt {self.attempt}: the job restarts; its rank processes were stopped")
            self.attempt = _next_attempt(self.watch, self.attempt)
            return None
        code, message = self.ranks.outcome()
        return code if code == ExitCode.OK else self._failed(code, message, ooms)

    def _interrupted(self) -> bool:
        """Polled while the rank processes run: whether to stop them (the pod is stopped, or the job
        went on to a newer attempt). Also passes the job's checkpoint request on, and starts the zygote
        once the attempt's gang formed (the next attempt's imports, now)."""
        view = self.watch.view
        self.request.sync(view)
        if view is not None and view.formed is not None and view.formed >= self.attempt:
            self.ranks.prepare_zygote(self.environ)
        return bool(self.stopping) or _newer(view, self.attempt)

    def _failed(self, code: int, message: str, ooms_before: int | None) -> int | None:
        """A rank process failed: report it and wait for the job's next attempt (None); the container's
        exit code where it cannot be reported, or the job ends with it, or the pod is stopped."""
        after = oom_kills()
        oom = code == SIGKILL_EXIT and after is not None and ooms_before is not None and after > ooms_before
        report = failure_report(self.attempt, code, message, oom, time.time())
        if not _report(self.sink, {STATUS_PROCESS_FAILURES: {str(self.index): report}}):
            leave_termination_message(message)  # no way to say it in place: the pod fails instead
            return code
        _mark(f"attempt {self.attempt}: a rank process exited with code {code}"
              f"{' (OOM-killed)' if oom else ''}; waiting for the job's next attempt")
        attempt = self.attempt
        newer = self.watch.wait(lambda v: v.attempt > attempt or v.phase in FINAL_PHASES, also=lambda: bool(self.stopping))
        if newer is None or newer.attempt <= attempt:  # stopped, or the job ended with this failure
            if not self.stopping:
                leave_termination_message(message)
            return ExitCode.TERMINATED if self.stopping else code
        self.attempt = newer.attempt
        return None


def _report(sink: JobStatusSink, fields: dict[str, object]) -> bool:
    """Write `fields` into the job's status, trying again for REPORT_TRIES_S while the API server is busy
    or away: without the report, the failure can only be said by ending the container."""
    deadline = time.monotonic() + REPORT_TRIES_S
    delay = 0.5
    while not sink.patch(fields):
        if time.monotonic() + delay > deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 5.0)
    return True


def _wait_out(watch: JobWatch, attempt: int, stopping: list[int]) -> int | None:
    """Wait, with no rank process, for the attempt after `attempt` (the loop sees whether it takes this
    pod in); the container's exit code where the job ended or the pod is stopped instead."""
    newer = watch.wait(lambda v: v.attempt > attempt or v.phase in FINAL_PHASES, also=lambda: bool(stopping))
    if newer is None:
        return ExitCode.TERMINATED
    if newer.phase in FINAL_PHASES:
        return ExitCode.OK if newer.phase == "Succeeded" else ExitCode.TERMINATED
    return None


def _newer(view: JobView | None, attempt: int) -> bool:
    return view is not None and view.attempt > attempt


def _next_attempt(watch: JobWatch, attempt: int) -> int:
    view = watch.view
    return view.attempt if view is not None and view.attempt > attempt else attempt + 1


def _mark(text: str) -> None:
    """A line in the container's output between attempts (the rank processes write theirs in between)."""
    print(f"==== ddp-trainer: {text} ====", file=sys.stderr, flush=True)
