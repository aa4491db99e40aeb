"""A Lightning script as its users write it, nothing of ddp-operator imported: a small classifier on
points of two interleaved spirals.

    command: [python, lightning_train.py, --nodes, "2"]     # one rank a pod; with ranksPerPod N: --devices N

Lightning takes its world from the environment: torchrun's where a launcher started it, else the pod's
NODE_RANK, LOCAL_RANK, MASTER_ADDR and MASTER_PORT, with num_nodes and devices as given here. With
--checkpoint-dir it saves last.ckpt there after each epoch and, started again, resumes from it
(fit(ckpt_path="last")), as Lightning users write it (keepFolders keeps that folder across pods).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import time

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
    parser.add_argument("--checkpoint-dir", help="save last.ckpt here each epoch, and resume from it")
    parser.add_argument("--step-seconds", type=float, default=0.0, help="sleep after each step (a slower model)")
    args = parser.parse_args()
    L.seed_everything(0)
    callbacks: list[L.Callback] = [Pause(args.step_seconds)] if args.step_seconds else []
    if args.checkpoint_dir:
        callbacks.append(L.pytorch.callbacks.ModelCheckpoint(dirpath=args.checkpoint_dir, save_last=True,
                                                             save_top_k=0, every_n_epochs=1))
    trainer = L.Trainer(accelerator="cpu", devices=args.devices, num_nodes=args.nodes, strategy="ddp",
                        max_epochs=args.epochs, enable_progress_bar=not args.no_bar, log_every_n_steps=8,
                        enable_checkpointing=bool(args.checkpoint_dir), logger=False, callbacks=callbacks)
    model = Classifier()
    last = os.path.join(args.checkpoint_dir, "last.ckpt") if args.checkpoint_dir else None
    resume = last if last and os.path.exists(last) else None
    print(json.dumps({"event": "resume", "rank": int(os.environ.get("RANK", "0")), "from": resume}), flush=True)
    trainer.fit(model, DataLoader(spirals(2048, seed=1), batch_size=32, shuffle=True), ckpt_path=resume)
    flat = torch.cat([p.detach().flatten() for p in model.parameters()]).numpy().tobytes()
    print(json.dumps({"event": "params", "rank": trainer.global_rank, "world_size": trainer.world_size,
                      "digest": hashlib.sha256(flat).hexdigest(), "global_step": trainer.global_step}), flush=True)
    trainer.strategy.barrier()  # before exiting: see hf_trainer.py's end


class Pause(L.Callback):
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, *args: object, **kwargs: object) -> None:
        time.sleep(self.seconds)


if __name__ == "__main__":
    main()
