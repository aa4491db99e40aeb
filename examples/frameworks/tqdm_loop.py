"""A plain DDP loop with tqdm bars, nothing of ddp-operator imported: each epoch draws a bar of its own
("Epoch 2/4") with the loss in its postfix.

    command: [python, tqdm_loop.py]       # one rank a pod; torchrun starts several (ranksPerPod)
"""

from __future__ import annotations

import hashlib
import json
import time

import torch
import torch.distributed as dist
from torch import nn
from tqdm import tqdm


def main(epochs: int = 4, steps: int = 40, step_seconds: float = 0.05) -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(dist.get_rank())
    for epoch in range(epochs):
        bar = tqdm(range(steps), desc=f"Epoch {epoch + 1}/{epochs}", disable=dist.get_rank() != 0)
        for _ in bar:
            features = torch.randn(16, 4, generator=generator)
            loss = nn.functional.mse_loss(model(features), features.sum(dim=1, keepdim=True))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            bar.set_postfix(loss=f"{loss.item():.3f}")
            time.sleep(step_seconds)
    flat = torch.cat([p.detach().flatten() for p in model.module.parameters()]).numpy().tobytes()
    print(json.dumps({"event": "params", "rank": dist.get_rank(), "world_size": dist.get_world_size(),
                      "digest": hashlib.sha256(flat).hexdigest()}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
