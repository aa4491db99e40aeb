"""S3 clients across fork."""

from __future__ import annotations

import multiprocessing
import os

from ddp_trainer.storage import s3


def test_a_client_lock_held_at_fork_does_not_block_the_child(s3_env) -> None:
    def worker() -> None:
        s3.client()  # would wait forever on the lock copied in its held state
        os._exit(0)

    s3.reset_clients()
    with s3._clients_lock:  # as a thread of the parent making its first client would at fork time
        child = multiprocessing.get_context("fork").Process(target=worker)
        child.start()
    child.join(30)
    if child.exitcode is None:
        child.kill()
    assert child.exitcode == 0
