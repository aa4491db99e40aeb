"""tests/lanes.py in real processes: the pytest-xdist workers' lock on the cluster and what they start once."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Iterator
from multiprocessing.synchronize import Event
from pathlib import Path

import pytest

import lanes
from kube import REPO, wait_until

FORK = multiprocessing.get_context("fork")


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A run's folder of its own, as the process running pytest makes it for its workers."""
    monkeypatch.delenv(lanes.RUN_DIR_ENV, raising=False)
    folder = lanes.begin_run()
    yield folder
    lanes.end_run()
    assert not folder.exists()


def hold(alone: bool, log: Path, name: str, release: Event) -> None:
    """A worker's test: logs when it got the cluster, holds it until `release`, logs its end."""
    with lanes.on_the_cluster(alone):
        with log.open("a") as out:
            out.write(f"{name} in\n")
        release.wait(60)
        with log.open("a") as out:
            out.write(f"{name} out\n")


def blocked_locks() -> int:
    """flock requests waiting in the kernel (/proc/locks lists each waiter after `->`)."""
    return sum("->" in line and "FLOCK" in line for line in Path("/proc/locks").read_text().splitlines())


class Worker:
    def __init__(self, alone: bool, log: Path, name: str) -> None:
        self.release = FORK.Event()
        self.process = FORK.Process(target=hold, args=(alone, log, name, self.release))
        self.process.start()

    def end(self) -> None:
        self.release.set()
        self.process.join(60)
        assert self.process.exitcode == 0


def lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_shared_tests_run_together_and_one_alone_waits_for_them_and_they_for_it(run: Path) -> None:
    log = run / "log"
    first, second = Worker(False, log, "first"), Worker(False, log, "second")
    wait_until(lambda: {"first in", "second in"} <= set(lines(log)), 30, "both shared tests on the cluster at once")
    waiting = blocked_locks()
    alone = Worker(True, log, "alone")
    wait_until(lambda: blocked_locks() > waiting, 30, "the alone test waiting for the cluster")
    # A shared test asking after it waits too: the turnstile keeps the alone one from being starved.
    late = Worker(False, log, "late")
    wait_until(lambda: blocked_locks() > waiting + 1, 30, "the late shared test waiting behind it")
    first.end()
    second.end()
    wait_until(lambda: "alone in" in lines(log), 30, "the alone test to get the cluster")
    assert "late in" not in lines(log)
    alone.end()
    late.end()
    assert lines(log)[-4:] == ["alone in", "alone out", "late in", "late out"]


def take_and_leave() -> None:
    with lanes.on_the_cluster(alone=False):
        pass


def test_the_timeline_says_how_long_a_test_waited_for_the_cluster(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    timeline, log = run / "timeline", run / "log"
    monkeypatch.setenv(lanes.TIMELINE_ENV, str(timeline))
    alone = Worker(True, log, "alone")
    wait_until(lambda: "alone in" in lines(log), 30, "the alone test on the cluster")
    waiting = blocked_locks()
    asked = time.time()
    shared = threading.Thread(target=take_and_leave)
    shared.start()
    wait_until(lambda: blocked_locks() > waiting, 30, "the shared test waiting for the cluster")
    time.sleep(0.5)  # the alone test's run, which the shared one waits out
    alone.end()
    shared.join(30)
    lanes.log_test("tests/t.py::test_shared", asked, time.time())
    lanes.log_test("tests/t.py::test_next", time.time(), time.time())
    (_, started, ended, waited, test), (*_, waited_next, _) = [line.split() for line in lines(timeline)]
    assert 0.5 <= float(waited) <= float(ended) - float(started) + 0.1 and test == "tests/t.py::test_shared"
    assert waited_next == "0.0", "each test's own wait"


def hold_module(log: Path, release: Event) -> None:
    """An alone module's worker: holds the cluster from its first test to its last (two, here)."""
    module = lanes.AloneModule()
    for test in ("alone 1", "alone 2"):
        module.enter("tests/a.py")
        with log.open("a") as out:
            out.write(f"{test} in\n")
    release.wait(60)
    with log.open("a") as out:
        out.write("alone out\n")
    module.leave()


def test_an_alone_module_holds_the_cluster_from_its_first_test_to_its_last(run: Path) -> None:
    log, release = run / "log", FORK.Event()
    alone = FORK.Process(target=hold_module, args=(log, release))
    alone.start()
    wait_until(lambda: "alone 2 in" in lines(log), 30, "the module's second test to run")
    waiting = blocked_locks()
    shared = Worker(False, log, "shared")
    wait_until(lambda: blocked_locks() > waiting, 30, "a shared test waiting for the module's end")
    release.set()
    alone.join(60)
    wait_until(lambda: "shared in" in lines(log), 30, "the shared test to get the cluster")
    shared.end()
    assert lines(log) == ["alone 1 in", "alone 2 in", "alone out", "shared in", "shared out"]


def start_once(name: str, started: bool, calls: Path) -> None:
    def start() -> bool:
        with calls.open("a") as out:
            out.write(f"{os.getpid()}\n")
        return started

    lanes.once(name, start)


def test_once_starts_a_thing_in_one_worker_and_lists_what_the_run_must_stop_in_order(run: Path) -> None:
    calls = run / "calls"
    for name, started in (("cluster", True), ("images", False), ("kueue", True)):
        workers = [FORK.Process(target=start_once, args=(name, started, calls)) for _ in range(3)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
            assert worker.exitcode == 0
    assert len(calls.read_text().split()) == 3  # one start of each, whichever worker came first
    assert lanes.started_in_run() == ["cluster", "kueue"]


def test_the_real_node_s_training_modules_share_one_lane_that_starts_first() -> None:
    assert {lanes.lane(module, ["cluster"]) for module in lanes.NODE_TRAINING_MODULES} == {lanes.NODE_TRAINING}
    assert lanes.lane("tests/e2e/test_main_job.py", ["jobs", "podrunner"]) == lanes.PODRUNNER
    assert lanes.lane("tests/trainer/test_gpu.py", ["tmp_path"]) == "tests/trainer/test_gpu.py"
    order = lanes.start_order(["a.py", "b.py", "b.py", lanes.NODE_TRAINING, *[lanes.PODRUNNER] * 3], {"a.py"})
    assert order == {lanes.NODE_TRAINING: 0, "a.py": 1, lanes.PODRUNNER: 2, "b.py": 3}
    assert all((REPO / module).is_file() for module in lanes.NODE_TRAINING_MODULES)  # none renamed away
