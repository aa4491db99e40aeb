"""Training code written for dask-pytorch-ddp, only its import changed (`from ddp_trainer import
DaskResultsHandler`): it reports nothing to the runtime, and prints each step's dict as
dask-pytorch-ddp's examples do (loss, epoch, count, worker)."""

from __future__ import annotations

import json
import time
import uuid

import helpers
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_trainer import DaskResultsHandler, RankContext

STEPS = 40

rh = DaskResultsHandler(uuid.uuid4().hex)


def train(ctx: RankContext) -> None:
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(3, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for count, (x, y) in enumerate(helpers.batches(ctx.rank, STEPS), start=1):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(json.dumps({"loss": loss.item(), "epoch": count // 20, "count": count, "worker": ctx.rank}), flush=True)
        time.sleep(0.25)  # slow enough for its progress to be watched while it runs
    if ctx.rank == 0:
        rh.submit_result(path="weights.json", data=json.dumps(model.module.weight.tolist()))
