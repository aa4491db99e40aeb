"""The termination message the kubelet hands to the operator."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_contract import envnames as names
from ddp_trainer.runtime.termination import TERMINATION_MESSAGE_BYTES, leave_termination_message


def test_the_end_of_a_long_message_is_kept_within_the_kubelets_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "termination-log"
    target.touch()  # the kubelet creates it in every container
    monkeypatch.setenv(names.TERMINATION_MESSAGE_PATH, str(target))
    leave_termination_message("x" * TERMINATION_MESSAGE_BYTES + "the last line")
    kept = target.read_text()
    assert len(kept) == TERMINATION_MESSAGE_BYTES and kept.endswith("the last line")


def test_outside_a_container_nothing_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "termination-log"
    monkeypatch.setenv(names.TERMINATION_MESSAGE_PATH, str(target))
    leave_termination_message("failed")
    assert not target.exists()
