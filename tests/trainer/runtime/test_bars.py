"""How far a job is, from the bars captured from real runs (tests/contract/printed/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_contract.metriclines import LineScanner, ProgressBar
from ddp_trainer.runtime.bars import BarProgress, BarTracker, training_loss

PRINTED = Path(__file__).resolve().parents[2] / "contract" / "printed"


def drawn(name: str) -> list[ProgressBar]:
    bars: list[ProgressBar] = []
    scanner = LineScanner(lambda line: None, bars.append)
    scanner.feed((PRINTED / name).read_bytes())
    return bars


def tracked(bars: list[ProgressBar]) -> list[BarProgress]:
    tracker = BarTracker()
    return [said for said in map(tracker.update, bars) if said is not None]


@pytest.mark.parametrize("version", ["4.57", "5.23"])
def test_hugging_face_s_run_bar_says_the_step_and_percent_and_its_evaluation_bars_nothing(version: str) -> None:
    said = tracked(drawn(f"transformers-{version}-trainer.stderr"))
    assert [s.step for s in said] == sorted(s.step for s in said if s.step is not None) and said[-1].step == 16
    assert [s.percent for s in said][-1] == 100.0 and said[0].percent == 100 * said[0].step / 16
    assert all(s.remaining_s is not None and s.epoch is None for s in said)


def test_lightning_s_tqdm_bar_says_the_epoch_and_step_but_not_how_far_the_run_is() -> None:
    said = tracked(drawn("lightning-2.6-tqdm-bar.stdout"))
    training = [s for s in said if s.epoch is not None]  # "Epoch N"; before it Lightning's "Training: 0/?"
    assert {s.epoch for s in training} == {0, 1} and all(s.percent is None for s in training)
    steps = [s.step for s in training]
    assert steps == sorted(steps) and steps[-1] == 32  # "Epoch 1" (from 0) at 16/16: 16 steps after epoch 0's
    assert all(s.step == 0 and s.percent is None for s in said if s.epoch is None)
    assert said[-1].loss == 0.551  # train_loss, not val_loss


def test_lightning_s_rich_bar_counts_its_epochs_from_zero() -> None:
    assert tracked(drawn("lightning-2.6-rich-bar.stdout")) == [BarProgress(epoch=1, step=32, loss=0.551, percent=100.0,
                                                                           remaining_s=0.0)]


def test_epoch_bars_that_say_how_many_and_an_outer_bar_around_inner_ones() -> None:
    bars = drawn("tqdm-4.70-nested.stderr")
    per_epoch = tracked([bar for bar in bars if bar.desc.startswith("Epoch")])
    assert [s.percent for s in per_epoch if s.epoch == 1][-1] == 50.0  # "Epoch 1/2" counts from 1
    assert (per_epoch[-1].epoch, per_epoch[-1].step, per_epoch[-1].percent) == (2, 20, 100.0)  # 2 epochs of 10
    outer = tracked([bar for bar in bars if bar.desc in ("epochs", "batches")])
    assert [s.step for s in outer][-1] == 3 and outer[-1].percent == 100.0  # the outer bar's; the inner one's never


def test_an_epoch_bar_counted_from_zero_and_the_time_left_over_the_epochs_to_come() -> None:
    tracker = BarTracker()
    tracker.update(ProgressBar("epoch 0/4", 10, 10, 5.0, 0.0, {}))
    said = tracker.update(ProgressBar("epoch 1/4", 5, 10, 5.0, 5.0, {"loss": 0.5}))
    # seen at 0: "1/4" is the second of four epochs, half done; 5 s left of it and 10 s for each of two more
    assert said == BarProgress(epoch=1, step=15, loss=0.5, percent=37.5, remaining_s=25.0)


@pytest.mark.parametrize(("values", "loss"), [
    ({"loss": 1.0, "train_loss": 2.0}, 1.0), ({"train_loss": 2.0, "val_loss": 3.0}, 2.0),
    ({"val_loss": 3.0, "eval_loss": 4.0}, None), ({"mlm_loss": 5.0}, 5.0), ({}, None)])
def test_the_training_loss_of_a_postfix(values: dict[str, float], loss: float | None) -> None:
    assert training_loss(values) == loss
