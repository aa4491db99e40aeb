"""A Lightning script as its users write it, nothing of ddp-operator imported: a small classifier on
points of two interleaved spirals.

    command: [python, lightning_train.py, --nodes, "2"]     # one rank a pod; with ranksPerPod N: --devices N

Lightning takes its world from the environment: torchrun's where a launcher started it, else the pod's
NODE_RANK, LOCAL_RANK, MASTER_ADDR and MASTER_PORT, with num_nodes and devices as given here.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Classifier(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        points, labels = batch
        loss = nn.functional.cross_entropy(self.net(points), labels)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=0.01)


def spirals(count: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    radius = torch.rand(count, generator=generator) * 3 * math.pi
    labels = torch.randint(0, 2, (count,), generator=generator)
    angle = radius + math.pi * labels
    points = torch.stack([radius * torch.cos(angle), radius * torch.sin(angle)], dim=1) / (3 * math.pi)
    return TensorDataset(points + 0.02 * torch.randn(count, 2, generator=generator), labels)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--no-bar", action="store_true", help="enable_progress_bar=False")
    args = parser.parse_args()
    L.seed_everything(0)
    trainer = L.Trainer(accelerator="cpu", devices=args.devices, num_nodes=args.nodes, strategy="ddp",
                        max_epochs=args.epochs, enable_progress_bar=not args.no_bar, log_every_n_steps=8,
                        enable_checkpointing=False, logger=False)
    model = Classifier()
    trainer.fit(model, DataLoader(spirals(2048, seed=1), batch_size=32, shuffle=True))
    flat = torch.cat([p.detach().flatten() for p in model.parameters()]).numpy().tobytes()
    print(json.dumps({"event": "params", "rank": trainer.global_rank, "world_size": trainer.world_size,
                      "digest": hashlib.sha256(flat).hexdigest()}), flush=True)


if __name__ == "__main__":
    main()
