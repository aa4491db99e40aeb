"""What a rank waits on, as the hang watch names it."""

from __future__ import annotations

import threading

from ddp_trainer.data import awaited


def test_a_wait_is_named_while_it_lasts_longest_first_and_per_thread() -> None:
    assert awaited.describe() == ""
    started = threading.Event()
    release = threading.Event()

    def other() -> None:
        with awaited.waiting_on("data worker b:29600 for batch 3"):
            started.set()
            release.wait(5)

    thread = threading.Thread(target=other)
    thread.start()
    started.wait(5)
    with awaited.waiting_on("data worker a:29600 for batch 7"):
        said = awaited.describe()
    release.set()
    thread.join()
    assert said.startswith("waiting on data worker b:29600 for batch 3 for 0s; waiting on data worker a:29600")
    assert awaited.describe() == ""
