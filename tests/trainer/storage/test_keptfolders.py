"""The rules of kept folders: what is kept when, what is removed, which checkpoint folders are whole."""

from __future__ import annotations

from pathlib import Path

from ddp_trainer.storage.keptfolders import (
    Behind,
    FileState,
    Rule,
    Settler,
    Writers,
    dcp_data_files,
    folder_times,
    incomplete_checkpoints,
    parts_from_other_pods,
    rank_states,
    ready,
    restorable,
    scan,
    scan_one,
    to_delete,
    to_upload,
    unkept_beside,
)


def test_scan_finds_regular_files_below_the_folder_by_relative_path(tmp_path: Path) -> None:
    (tmp_path / "checkpoint-2").mkdir()
    (tmp_path / "checkpoint-2" / "model.safetensors").write_bytes(b"x" * 10)
    (tmp_path / "events").write_bytes(b"")
    (tmp_path / "link").symlink_to(tmp_path / "events")
    (tmp_path / "empty").mkdir()
    found = scan(str(tmp_path))
    assert sorted(found) == ["checkpoint-2/model.safetensors", "events"]
    assert found["checkpoint-2/model.safetensors"].size == 10
    assert scan(str(tmp_path / "missing")) == {}
    assert scan_one(str(tmp_path / "link")) is None and scan_one(str(tmp_path / "nope")) is None
    assert scan_one(str(tmp_path / "events")) == found["events"]


def test_a_file_settles_once_its_state_stays_the_same_for_the_settle_time() -> None:
    settler = Settler(10)
    a1, a2 = FileState(1, 100), FileState(2, 200)
    settler.observe({"a": a1}, now=0)
    assert settler.settled(9.9) == {}
    assert settler.settled(10) == {"a": a1}
    settler.observe({"a": a2}, now=11)  # written again: its clock starts over
    assert settler.settled(20) == {}
    assert settler.settled(21) == {"a": a2}
    settler.observe({}, now=22)  # removed: forgotten
    assert settler.settled(100) == {}


def test_a_file_no_process_holds_open_for_writing_is_ready_at_once_one_held_once_it_settled() -> None:
    files = {"snapshot.pt": FileState(9, 2), "events": FileState(5, 2), "log": FileState(7, 1)}
    settled = {"log": FileState(7, 1)}
    assert ready(files, settled, writing={"events", "log"}, ended_cleanly=False) == {
        "snapshot.pt": Rule.WHOLE, "log": Rule.SETTLED}
    # The ranks are not all running, or /proc cannot tell: settled files only.
    assert ready(files, settled, writing=None, ended_cleanly=False) == {"log": Rule.SETTLED}
    assert ready(files, {"log": FileState(6, 1)}, writing=None, ended_cleanly=False) == {}  # changed since
    assert ready(files, {}, writing=None, ended_cleanly=True) == dict.fromkeys(files, Rule.ENDED)


def test_a_version_left_by_a_writer_that_ended_holding_it_counts_as_being_written_until_it_changes() -> None:
    writers, ended = Writers(), {7}
    v1, v2 = FileState(3, 1), FileState(9, 2)
    writers.observe({"a.pt": v1, "b.pt": v1, "c.pt": v1}, {"a.pt": frozenset({7}), "b.pt": frozenset({8})},
                    ended.__contains__)
    assert writers.writing() == {"a.pt", "b.pt"}
    writers.observe({"a.pt": v1, "b.pt": v1, "c.pt": v1}, {}, ended.__contains__)  # both closed; 7 has ended
    assert writers.writing() == {"a.pt"}  # b.pt's writer closed it and goes on: whole
    writers.observe({"a.pt": v1, "b.pt": v1}, {}, ended.__contains__)
    assert writers.writing() == {"a.pt"}
    writers.observe({"a.pt": v2, "b.pt": v1}, {}, ended.__contains__)  # written again, and closed
    assert writers.writing() == set()


def test_a_folder_is_behind_since_the_oldest_change_not_kept_was_first_seen() -> None:
    behind = Behind()
    v1, v2 = FileState(1, 1), FileState(2, 2)
    behind.observe({"a": v1, "b": v1}, {"a": v1, "b": v1}, now=100)
    assert (behind.pending(), behind.since()) == (0, None)
    behind.observe({"a": v2, "b": v1}, {"a": v1, "b": v1}, now=105)
    behind.observe({"a": v1, "b": v2, "c": v1}, {"a": v1, "b": v1}, now=110)  # a kept at last; b and c new
    assert (behind.pending(), behind.since()) == (2, 110)
    behind.observe({"a": v1, "b": v1, "c": v2}, {"a": v1, "b": v1}, now=115)  # c rewritten: still since 110
    assert (behind.pending(), behind.since()) == (1, 110)
    behind.observe({"a": v1, "b": v1}, {"a": v1, "b": v1}, now=120)  # c removed
    assert (behind.pending(), behind.since()) == (0, None)


def test_a_checkpoint_s_marker_waits_until_the_other_files_of_its_folder_here_are_kept_as_they_are() -> None:
    v1, v2 = FileState(1, 1), FileState(2, 2)
    files = {"checkpoint-4/model.safetensors": v2, "checkpoint-4/optimizer.pt": v1, "checkpoint-4/sub/x": v1,
             "checkpoint-4/trainer_state.json": v1, "checkpoint-40/model.safetensors": v1, "other": v2}
    kept = {"checkpoint-4/model.safetensors": v1, "checkpoint-4/sub/x": v1}
    assert unkept_beside("checkpoint-4/trainer_state.json", "checkpoint-4", files, kept) == [
        "checkpoint-4/model.safetensors", "checkpoint-4/optimizer.pt"]
    kept.update(files)
    assert unkept_beside("checkpoint-4/trainer_state.json", "checkpoint-4", files, kept) == []


def test_uploads_are_the_changed_files_with_the_tools_last_written_files_last() -> None:
    state = FileState(1, 1)
    ready = {name: state for name in ("checkpoint-5/trainer_state.json", "checkpoint-5/model.safetensors",
                                      "dcp/.metadata", "dcp/__0_0.distcp", "runs/events", "same")}
    kept = {"same": state, "runs/events": FileState(0, 1)}
    assert to_upload(ready, kept) == ["checkpoint-5/model.safetensors", "dcp/__0_0.distcp", "runs/events",
                                      "checkpoint-5/trainer_state.json", "dcp/.metadata"]


def test_a_trainer_checkpoint_s_marker_waits_for_every_rank_s_rng_state_where_the_ranks_write_one_each(
        tmp_path: Path) -> None:
    local = ["out/checkpoint-32/model.safetensors", "out/checkpoint-32/rng_state_0.pth",
             "out/checkpoint-32/trainer_state.json", "out/checkpoint-16/rng_state_1.pth"]
    assert parts_from_other_pods("out/checkpoint-32/trainer_state.json", local, str(tmp_path), world=3) == (
        "out/checkpoint-32", ["out/checkpoint-32/rng_state_0.pth", "out/checkpoint-32/rng_state_1.pth",
                              "out/checkpoint-32/rng_state_2.pth"])
    # One rank (rng_state.pth), or save_only_model (none): nothing of other ranks to wait for.
    assert rank_states("checkpoint-8", ["checkpoint-8/rng_state.pth"], world=1) == []
    assert rank_states("checkpoint-8", ["checkpoint-8/model.safetensors"], world=2) == []
    for other in ("trainer_state.json", "checkpoint-32/config.json", "runs/events", "last.ckpt"):
        assert parts_from_other_pods(other, local, str(tmp_path), world=3) == ("", [])  # not a marker


def test_a_distributed_checkpoint_s_marker_waits_for_the_files_its_metadata_names(tmp_path: Path) -> None:
    import torch
    import torch.distributed.checkpoint as dcp

    dcp.save({"w": torch.ones(3)}, checkpoint_id=tmp_path / "dcp" / "step-1")  # one process: __0_0.distcp
    assert dcp_data_files(str(tmp_path), "dcp/step-1") == ["dcp/step-1/__0_0.distcp"]
    assert parts_from_other_pods("dcp/step-1/.metadata", [], str(tmp_path), world=2) == (
        "dcp/step-1", ["dcp/step-1/__0_0.distcp"])
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / ".metadata").write_bytes(b"not a pickle")  # some other tool's: nothing to wait for
    assert parts_from_other_pods("other/.metadata", [], str(tmp_path), world=2) == ("other", [])


def test_a_folder_gone_whole_is_removed_whole_and_single_files_one_by_one() -> None:
    kept = ["checkpoint-1/model.safetensors", "checkpoint-1/rng_state_0.pth", "checkpoint-1/sub/x",
            "checkpoint-2/model.safetensors", "checkpoint-2/optimizer.pt", "last.ckpt", "runs/a"]
    local = ["checkpoint-2/model.safetensors", "runs/a"]
    assert to_delete(local, kept) == (["checkpoint-1"], ["checkpoint-2/optimizer.pt", "last.ckpt"])
    assert to_delete(kept, kept) == ([], [])


def test_a_hugging_face_checkpoint_is_whole_once_it_holds_trainer_state_json() -> None:
    names = ["checkpoint-2/model.safetensors", "checkpoint-2/trainer_state.json", "checkpoint-2/rng_state_1.pth",
             "checkpoint-3/model.safetensors", "checkpoint-3/optimizer.pt", "runs/events", "config.json",
             "nested/checkpoint-7/rng_state_0.pth", "checkpoint-best/model.safetensors"]
    assert incomplete_checkpoints(names) == {"checkpoint-3", "nested/checkpoint-7"}
    files, torn = restorable(names)
    assert torn == {"checkpoint-3", "nested/checkpoint-7"}
    assert files == sorted(["checkpoint-2/model.safetensors", "checkpoint-2/rng_state_1.pth",
                            "checkpoint-2/trainer_state.json", "checkpoint-best/model.safetensors", "config.json",
                            "runs/events"])


def test_a_torch_distributed_checkpoint_is_whole_once_it_holds_its_metadata() -> None:
    assert incomplete_checkpoints(["step-1/__0_0.distcp", "step-1/.metadata", "step-2/__0_0.distcp"]) == {"step-2"}


def test_restored_folders_take_the_time_of_their_newest_file() -> None:
    assert folder_times({"checkpoint-1/a": 5, "checkpoint-1/b/c": 9, "top": 1}) == \
        {"checkpoint-1": 9, "checkpoint-1/b": 9}

