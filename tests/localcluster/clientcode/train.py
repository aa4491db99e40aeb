"""A notebook user's training function in a file of its own, run as `submit("train.py:train")`:
dask-pytorch-ddp's results handler by its import, progress for wait(), metrics for plot()."""

from __future__ import annotations

import json
import uuid

import helpers
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_trainer import DaskResultsHandler, RankContext, default_reporter

STEPS = 12

rh = DaskResultsHandler(uuid.uuid4().hex)


def train(ctx: RankContext) -> None:
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(3, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    progress = default_reporter()
    for step, (x, y) in enumerate(helpers.batches(ctx.rank, STEPS), start=1):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        rh.log_metrics(step, 0, loss)
        progress.report(epoch=0, step=step, loss=loss.item(), samples=len(x) * ctx.world_size)
        print(json.dumps({"step": step, "loss": round(loss.item(), 4), "worker": ctx.rank}), flush=True)
    if ctx.rank == 0:
        rh.submit_result(path="weights.json", data=json.dumps(model.module.weight.tolist()))
    rh.close()
