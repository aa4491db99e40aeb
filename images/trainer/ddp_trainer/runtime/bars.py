"""How far a job is, from the progress bars its rank 0 draws (ddp_contract.metriclines.parse_bar).

Training code draws several bars: Hugging Face's Trainer one for every step of the run and one for
each evaluation, Lightning one per epoch ("Epoch 3") and one for validation, a plain loop one per epoch
or an outer one over epochs with an inner one over batches. The job's bar is an epoch bar where one is
drawn, else the first bar drawn (the run's, opened before any inner or evaluation bar); bars are told
apart by their description without its numbers and their total. A validation, sanity-check,
evaluation, test or prediction bar (by its description) is never the job's.

- An epoch bar says the epoch and, with its total, the step: the steps of the epochs before it (as
  many as this one's) and its count. With the number of epochs ("Epoch 3/9": Lightning's rich bar
  counts from 0 to the last; a tqdm description such as "epoch 4/10" from 1, unless it showed an
  epoch 0), also how far the run is and the time left (this epoch's, and the epochs after it at this
  epoch's pace). Lightning's tqdm bar ("Epoch 3") does not say how many epochs there are: no percent then.
- Any other job's bar says the step (its count) and, with a total, the percent and the time left as
  tqdm estimates it.
- The loss is the job's bar's (`loss=`, `train_loss=`), else the last one any training bar showed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from ddp_contract.metriclines import ProgressBar

_EPOCH = re.compile(r"\bepoch\s*(?P<epoch>\d+)(?:\s*/\s*(?P<of>\d+))?", re.IGNORECASE)
_DIGITS = re.compile(r"\d+")
_NOT_TRAINING = ("val", "eval", "test")
# Bars of what is not the run's training: never the job's bar.
_ASIDE = re.compile(r"^\s*(val|sanity|eval|test|predict)", re.IGNORECASE)


@dataclass(frozen=True)
class BarProgress:
    epoch: int | None = None
    step: int | None = None
    loss: float | None = None
    percent: float | None = None
    remaining_s: float | None = None


class BarTracker:
    def __init__(self) -> None:
        self._first: tuple[str, float | None] | None = None
        self._epochs = False  # an epoch bar was drawn: only such bars are the job's from then on
        self._zero_based: set[str] = set()  # epoch bars seen at epoch 0
        self._epoch_drawn: tuple[str, int, float] | None = None  # the last epoch bar's key, epoch and count
        self._loss: float | None = None

    def update(self, bar: ProgressBar) -> BarProgress | None:
        """What `bar` says of the job, or None where it is not the job's bar (an inner or evaluation
        bar; the loss it shows is still kept)."""
        loss = training_loss(bar.values)
        if loss is not None:
            self._loss = loss
        if _ASIDE.match(bar.desc):
            return None
        epoch = _EPOCH.search(bar.desc)
        if epoch is not None:
            self._epochs = True
            kind, number = _DIGITS.sub("#", bar.desc.strip().lower()), int(epoch["epoch"])
            last, self._epoch_drawn = self._epoch_drawn, (kind, number, bar.n)
            if bar.n == 0 and last is not None and last[:2] == (kind, number) and last[2] > 0:
                return None  # a bar reset for the next epoch before its description says it (Lightning's tqdm)
            return self._epoch_progress(bar, kind, number, int(epoch["of"]) if epoch["of"] else None)
        if self._epochs:
            return None
        key = (_DIGITS.sub("#", bar.desc.strip().lower()), bar.total)
        if self._first is None:
            self._first = key
        if key != self._first:
            return None
        fraction = bar.fraction
        return BarProgress(step=int(bar.n), loss=self._loss, percent=None if fraction is None else 100 * fraction,
                           remaining_s=bar.remaining_s if fraction is not None else None)

    def _epoch_progress(self, bar: ProgressBar, kind: str, epoch: int, of: int | None) -> BarProgress:
        """`kind`: the bar's description without its numbers."""
        if epoch == 0:
            self._zero_based.add(kind)
        # The epochs before this one: Lightning's bars count from 0 ("Epoch e/E", e up to E, for the rich
        # one), a tqdm description from 1 unless it showed an epoch 0.
        before = max(0, epoch if bar.rich or kind in self._zero_based else epoch - 1)
        step = int(before * bar.total + bar.n) if bar.total else None
        if of is None or bar.fraction is None:
            return BarProgress(epoch=epoch, step=step, loss=self._loss)
        epochs = of + 1 if bar.rich else of
        done = min(before, epochs)
        fraction = min(1.0, (done + bar.fraction) / epochs) if epochs else None
        remaining = None
        if bar.remaining_s is not None and bar.elapsed_s is not None:
            remaining = bar.remaining_s + max(0, epochs - done - 1) * (bar.elapsed_s + bar.remaining_s)
        return BarProgress(epoch=epoch, step=step, loss=self._loss,
                           percent=None if fraction is None else 100 * fraction, remaining_s=remaining)


def training_loss(values: Mapping[str, float]) -> float | None:
    """The training loss among a bar's numbers: `loss`, `train_loss`, else another `...loss` that is not
    a validation, evaluation or test loss."""
    for key in ("loss", "train_loss"):
        if key in values:
            return values[key]
    return next((value for key, value in values.items()
                 if key.endswith("loss") and not key.startswith(_NOT_TRAINING)), None)
