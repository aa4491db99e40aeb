"""A state split into its structure and storages and joined again is the state, sharing kept."""

from __future__ import annotations

from collections import OrderedDict, namedtuple

import torch

from ddp_trainer.storage.statebytes import copied_to_cpu, join, split

Pair = namedtuple("Pair", "a b")


def test_a_state_joined_from_its_parts_equals_it_and_keeps_shared_storages_shared() -> None:
    weight = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    state = {"model": OrderedDict(w=weight, view=weight[1], half=torch.ones(3, dtype=torch.float16)),
             "pair": Pair(torch.tensor([1, 2]), 7), "lr": 0.1, "empty": torch.empty(0)}
    parts = split(state)
    assert len(parts.storages) == 4  # the view shares the weight's storage
    assert parts.nbytes == 48 + 6 + 16 + 0
    back = join(parts.structure, [s.clone() for s in parts.storages])
    assert torch.equal(back["model"]["w"], weight) and torch.equal(back["model"]["view"], weight[1])
    assert back["model"]["half"].dtype == torch.float16 and isinstance(back["pair"], Pair) and back["lr"] == 0.1
    back["model"]["w"][1, 0] = 100.0
    assert back["model"]["view"][0] == 100.0 and weight[1, 0] == 4.0  # shared between them, not with the original


def test_a_copy_to_cpu_does_not_change_when_training_goes_on() -> None:
    model = torch.nn.Linear(3, 2)
    copied = copied_to_cpu(model.state_dict())
    before = copied["weight"].clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    assert torch.equal(copied["weight"], before)
