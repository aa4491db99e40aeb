"""Snapshots in the pod's memory: two slots in turn, committed last, read back bit for bit; what fits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ddp_trainer.errors import CorruptDataError
from ddp_trainer.storage.checkpoint import restore_training_state, training_state
from ddp_trainer.storage.podsnapshots import (
    PodSnapshots,
    Room,
    SnapshotsDoNotFit,
    SnapshotTaker,
    layout_of,
    misfit,
    room,
)


def trained(steps: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(1)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(4, 8, generator=data)).pow(2).sum().backward()
        optimizer.step()
    return model, optimizer


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_each_snapshot_goes_to_the_slot_not_holding_the_newest_and_loads_back_bit_for_bit(tmp_path: Path) -> None:
    snapshots = PodSnapshots(tmp_path / "pod")
    taker = SnapshotTaker(snapshots, attempt=2)
    model, optimizer = trained(1)
    for step in (1, 2, 3):
        taker.take(step, training_state(model, optimizer, epoch=step))
        expected = {k: v.clone() for k, v in model.state_dict().items()}
        # The next step changes the parameters while their copy may still be under way: it waits for it.
        optimizer.zero_grad()
        model(torch.randn(4, 8)).pow(2).sum().backward()
        optimizer.step()
        taker.wait()
        newest = snapshots.held()[0]
        assert (newest.step, newest.attempt) == (step, 2)
        assert same(snapshots.load(newest)["model"], expected)
    assert [(h.step, h.slot) for h in snapshots.held()] == [(3, 0), (2, 1)]
    fresh, fresh_optimizer = trained(0)
    restore_training_state(snapshots.load(snapshots.held()[0]), fresh, fresh_optimizer)
    assert fresh_optimizer.state_dict()["state"][0]["step"] == 3  # Adam's own count, from the snapshot


def test_a_slot_being_written_is_not_offered_and_a_damaged_one_does_not_load(tmp_path: Path) -> None:
    snapshots = PodSnapshots(tmp_path)
    taker = SnapshotTaker(snapshots, attempt=0)
    model, optimizer = trained(1)
    taker.take(1, training_state(model, optimizer))
    taker.wait()
    taker.take(2, training_state(model, optimizer))
    taker.wait()
    # A process killed while copying step 3 into slot 1: its record went first, step 2's slot is the newest.
    snapshots.uncommit(1)
    (tmp_path / "slot-1.data").write_bytes(b"\0" * 10)
    assert [h.step for h in snapshots.held()] == [1]
    data = bytearray((tmp_path / "slot-0.data").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (tmp_path / "slot-0.data").write_bytes(data)
    with pytest.raises(CorruptDataError, match="does not match its checksum"):
        snapshots.load(snapshots.held()[0])
    (tmp_path / "slot-1.json").write_text("{not json")
    assert [h.step for h in snapshots.held()] == [1]  # an unreadable record is left out, not fatal


def test_a_resumed_gang_forgets_snapshots_past_its_step_and_a_cleared_pod_holds_none(tmp_path: Path) -> None:
    snapshots = PodSnapshots(tmp_path)
    taker = SnapshotTaker(snapshots, attempt=0)
    model, optimizer = trained(1)
    for step in (4, 5):
        taker.take(step, training_state(model, optimizer))
        taker.wait()
    snapshots.note_reached(6)
    assert snapshots.reached() == 6
    snapshots.prune_after(4)
    assert [h.step for h in snapshots.held()] == [4]
    snapshots.clear()
    assert snapshots.held() == [] and snapshots.reached() is None and snapshots.holds() == 0


def test_two_copies_that_would_not_fit_say_what_to_raise() -> None:
    slot = layout_of([100 << 20])[1]
    assert misfit(100 << 20, 0, Room(free=2 * slot, memory_limit=None, memory_used=None), Path("/dev/shm/x")) is None
    small_shm = misfit(100 << 20, 0, Room(free=64 << 20, memory_limit=None, memory_used=None), Path("/dev/shm/x"))
    assert small_shm is not None and "200.0 MiB in /dev/shm/x, which has 64.0 MiB" in small_shm
    assert "spec.shmSize" in small_shm
    # Space held by the pod's own earlier snapshots counts as free for the next ones.
    assert misfit(100 << 20, 2 * slot, Room(free=0, memory_limit=None, memory_used=None), Path("/s")) is None
    tight = misfit(100 << 20, 0, Room(free=1 << 40, memory_limit=1 << 30, memory_used=800 << 20), Path("/s"))
    assert tight is not None and "from 800.0 MiB to 1000.0 MiB, past 921.6 MiB (90% of its limit, 1.0 GiB)" in tight
    assert "raise spec.resources.limits.memory by at least 78.4 MiB" in tight


def test_room_reads_the_container_memory_limit_and_usage(tmp_path: Path) -> None:
    found = room(tmp_path)
    assert found.free > 0
    assert found.memory_limit is None or found.memory_used is not None


def test_a_state_that_does_not_fit_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    snapshots = PodSnapshots(tmp_path)
    taker = SnapshotTaker(snapshots, attempt=0, fits=lambda nbytes, held: f"{nbytes} bytes do not fit")
    model, optimizer = trained(1)
    with pytest.raises(SnapshotsDoNotFit, match="bytes do not fit"):
        taker.take(1, training_state(model, optimizer))
    assert snapshots.held() == [] and not list(tmp_path.glob("slot-*"))
