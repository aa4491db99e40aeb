"""A pod's snapshots served to its peers on loopback: to those that prove the job's token, verified, and no
longer once the server is closed."""

from __future__ import annotations

import socket
from multiprocessing import AuthenticationError
from pathlib import Path

import pytest
import torch

from ddp_trainer.errors import CorruptDataError
from ddp_trainer.storage.podsnapshots import PodSnapshots, SnapshotTaker, state_of
from ddp_trainer.storage.snapshotpeers import SnapshotServer, fetch


def held_snapshot(directory: Path) -> PodSnapshots:
    snapshots = PodSnapshots(directory)
    taker = SnapshotTaker(snapshots, attempt=0)
    taker.take(7, {"weight": torch.arange(12, dtype=torch.float32), "step": 7})
    taker.wait()
    return snapshots


def test_a_peer_with_the_job_s_token_gets_the_snapshot_and_one_without_is_refused(tmp_path: Path) -> None:
    with SnapshotServer(held_snapshot(tmp_path), "127.0.0.1", b"job-token") as server:
        with pytest.raises(AuthenticationError):
            fetch("127.0.0.1", server.port, b"guessed", 7)
        fetched = fetch("127.0.0.1", server.port, b"job-token", 7)  # served after a refusal too
        state = state_of(fetched.held, fetched.data)
        assert state["step"] == 7 and torch.equal(state["weight"], torch.arange(12, dtype=torch.float32))
        with pytest.raises(CorruptDataError, match="no snapshot of step 8"):
            fetch("127.0.0.1", server.port, b"job-token", 8)


def test_closing_the_server_ends_its_accepting_thread_at_once(tmp_path: Path) -> None:
    """A restarted gang closes every pod's server before it trains: a server whose accepting thread stayed
    blocked would hold each restart up for the thread's join timeout."""
    server = SnapshotServer(held_snapshot(tmp_path), "127.0.0.1", b"job-token")
    server.close()
    assert not server._thread.is_alive()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=1)
