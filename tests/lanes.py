"""How the tests on the cluster share it when pytest-xdist runs them in several workers at once.

Each worker has its own operator and namespaces (`t-<session>-*`), so most tests on the cluster run beside
each other; a test module marked `alone` (tests that take the cluster or its node down, replace cluster-wide
objects, start an operator for every namespace, or need the shared nodes' capacity to themselves) runs with
no other test on the cluster. The lock is a readers-writer lock on a file of the test run's own folder,
with a turnstile so that a waiting `alone` test is not starved by the others taking turns.

What the whole run shares (the cluster, Kueue, the images on the node) is started once, by whichever worker
needs it first, under a lock of its own; the process that ran `pytest` stops what was started in its run, at
its end (its pid owns the watchdogs, so a worker that ends first takes nothing down).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

RUN_DIR_ENV = "DDP_TEST_RUN_DIR"
OWNER_PID_ENV = "DDP_TEST_OWNER_PID"
TIMELINE_ENV = "DDP_TEST_TIMELINE"
# The mark of a test module that must have the cluster to itself: pytest.mark.alone("why").
ALONE = "alone"
# The modules whose jobs train on the real node, each test several gangs of processes that keep both cores
# busy: one lane, started first. Two or three of them at once made each several times slower (the Hugging
# Face test 640 s against 170), past their timeouts on a slower machine, where one after another beside
# the lanes that mostly wait on the cluster takes no longer than the longest of them.
NODE_TRAINING = "node-training"
NODE_TRAINING_MODULES = (
    "tests/e2e/test_examples.py",
    "tests/localcluster/test_real_node_commands.py",
    "tests/localcluster/test_real_node_kept.py",
    "tests/localcluster/test_real_node_training.py",
)
PODRUNNER = "podrunner"


def lane(module: str, fixtures: Iterable[str]) -> str:
    """The pytest-xdist lane (xdist_group) of a test of `module`: the modules with a podrunner
    (e2e/conftest.py) share its node name and the ranks' loopback port; those that train on the real node
    share its cores; every other module is a lane of its own."""
    if module in NODE_TRAINING_MODULES:
        return NODE_TRAINING
    return PODRUNNER if PODRUNNER in fixtures else module


def start_order(lanes_of_tests: list[str], alone: set[str]) -> dict[str, int]:
    """The place each lane starts in: the real node's training first; then the modules that take the cluster
    alone, while it still starts (the others' tests on it would have to end first, minutes later); then
    the lanes of most tests (as pytest-xdist orders them, which `make test`'s --no-loadscope-reorder turns
    off for the first)."""
    counts = Counter(lanes_of_tests)
    ordered = sorted(counts, key=lambda name: (name != NODE_TRAINING, name not in alone, -counts[name]))
    return {name: place for place, name in enumerate(ordered)}


def begin_run() -> Path:
    """In the process that runs pytest (not its workers): the run's folder, which its workers inherit."""
    run = Path(tempfile.mkdtemp(prefix="ddp-test-run-"))
    os.environ[RUN_DIR_ENV] = str(run)
    os.environ[OWNER_PID_ENV] = str(os.getpid())
    return run


def run_dir() -> Path:
    return Path(os.environ[RUN_DIR_ENV])


def owner_pid() -> str:
    """The pid the run's watchdogs follow: the pytest process, not the worker that started something."""
    return os.environ[OWNER_PID_ENV]


def started_in_run() -> list[str]:
    """What this run started (each name `once` recorded), in the order it was started."""
    marks = sorted(run_dir().glob("started-*"), key=lambda path: path.stat().st_mtime_ns)
    return [mark.name.removeprefix("started-") for mark in marks]


def end_run() -> None:
    shutil.rmtree(run_dir(), ignore_errors=True)


@contextmanager
def _flock(name: str, mode: int) -> Iterator[None]:
    with open(run_dir() / f"{name}.lock", "a") as handle:
        fcntl.flock(handle, mode)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def once(name: str, start: Callable[[], bool | None]) -> None:
    """Runs `start` in the first worker to get here, the others waiting for it; `start` returns True if it
    started something the run must stop at its end (recorded as `name`)."""
    with _flock(f"once-{name}", fcntl.LOCK_EX):
        done = run_dir() / f"done-{name}"
        if done.exists():
            return
        if start() is True:
            (run_dir() / f"started-{name}").touch()
        done.touch()


# Seconds this worker's current test waited for the cluster (on_the_cluster), for the timeline.
_waited = 0.0


@contextmanager
def on_the_cluster(alone: bool) -> Iterator[None]:
    """Held while a test on the cluster runs: shared with the others, or the cluster to itself."""
    global _waited
    with ExitStack() as held:
        asked = time.monotonic()
        with _flock("turnstile", fcntl.LOCK_EX):
            held.enter_context(_flock("cluster", fcntl.LOCK_EX if alone else fcntl.LOCK_SH))
        _waited += time.monotonic() - asked
        yield


class AloneModule:
    """A worker's hold of the cluster for itself, from the first test of a module marked `alone` to its last:
    the other workers' tests on the cluster end once for the module, not once for each of its tests."""

    def __init__(self) -> None:
        self._held = ExitStack()
        self.module: str | None = None

    def enter(self, module: str) -> None:
        if self.module != module:
            self.leave()
            self._held.enter_context(on_the_cluster(alone=True))
            self.module = module

    def leave(self) -> None:
        self._held.close()
        self.module = None


def log_test(nodeid: str, started: float, ended: float) -> None:
    """One line of the run's timeline ($DDP_TEST_TIMELINE, if set): worker, start, end (time.time()), the
    seconds it waited for the cluster (other workers' tests alone on it, or its own alone test for theirs to
    end), test."""
    global _waited
    waited, _waited = _waited, 0.0
    timeline = os.environ.get(TIMELINE_ENV)
    if timeline:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(timeline, "a") as out:
            out.write(f"{worker} {started:.1f} {ended:.1f} {waited:.1f} {nodeid}\n")
