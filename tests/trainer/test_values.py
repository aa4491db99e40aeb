"""to_number: what the runtime writes into JSON records from tensors and numpy scalars."""

from __future__ import annotations

import numpy as np
import torch

from ddp_trainer.values import to_number


def test_tensors_and_numpy_scalars_become_plain_numbers() -> None:
    assert to_number(torch.tensor(2.5)) == 2.5 and type(to_number(torch.tensor(2.5))) is float
    assert to_number(torch.tensor([7])) == 7 and type(to_number(torch.tensor([7]))) is int
    assert type(to_number(np.float32(0.5))) is float


def test_what_is_not_one_number_stays_as_it_is() -> None:
    many = torch.tensor([1.0, 2.0])
    assert to_number(many) is many
    assert to_number(None) is None and to_number("lr") == "lr" and to_number(3) == 3
