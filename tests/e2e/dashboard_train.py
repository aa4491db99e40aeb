"""A small DDP job for the dashboard's browser test: a linear model on fixed random data, `steps` steps
paced `pause` seconds apart, each rank's loss logged every step and flushed to S3 every second, so its
curve grows on the page while it trains. Run as `dashboard_train.py STEPS PAUSE`."""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_trainer import S3ResultsHandler, default_reporter


def train(steps: int, pause: float) -> None:
    torch.manual_seed(0)
    inputs, targets = torch.randn(64, 8), torch.randn(64, 1)
    model = DDP(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    results, progress = S3ResultsHandler(flush_interval_s=1.0), default_reporter()
    for step in range(1, steps + 1):
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        results.log_metrics(step, 0, loss)
        progress.report(0, step, loss.item(), samples=len(inputs) * dist.get_world_size())
        time.sleep(pause)
    results.close()


if __name__ == "__main__":
    train(int(sys.argv[1]), float(sys.argv[2]))
