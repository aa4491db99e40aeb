"""A script whose dataset class is defined in the script itself, its DataLoader workers on the job's
data workers (spec.dataWorkers): every rank prints every batch it gets, so a test can hold them to
what a local DataLoader makes. $FAIL_AT: that sample raises; $OOM_AFTER: on data worker 0, a
logical worker's batch after that many goes over the pod's memory limit (an OOM kill mid-epoch)."""

from __future__ import annotations

import json
import os
import time

import torch
from torch.utils.data import Dataset

from ddp_trainer import DataLoader, RankContext

EPOCHS = 3
SAMPLES = 48


class Noisy(Dataset[torch.Tensor]):
    def __init__(self, fail_at: int = -1, oom_after: int = -1) -> None:
        self.fail_at = fail_at
        self.oom_after = oom_after
        self.served = 0

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == self.fail_at:
            raise ValueError(f"sample {index} is corrupt")
        self.served += 1
        if self.oom_after >= 0 and self.served > self.oom_after * 4 and os.environ.get("HOSTNAME", "").endswith("-data-0"):
            hog = bytearray(4 << 30)  # every page written: far over the data worker's memory limit
            print(len(hog))
        return torch.full((2,), float(index)) + torch.rand(2)


def loader(rank: int, dataset: Noisy) -> DataLoader[torch.Tensor]:
    return DataLoader(dataset, batch_size=4, shuffle=True, num_workers=2, generator=torch.Generator().manual_seed(rank))


def train(ctx: RankContext) -> None:
    dataset = Noisy(int(os.environ.get("FAIL_AT", "-1")), int(os.environ.get("OOM_AFTER", "-1")))
    for epoch in range(EPOCHS):
        for batch in loader(ctx.rank, dataset):
            print(json.dumps({"epoch": epoch, "batch": batch.tolist()}), flush=True)
            time.sleep(0.3)
