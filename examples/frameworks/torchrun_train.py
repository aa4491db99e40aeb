"""pytorch/examples' distributed/ddp-tutorial-series multinode.py, as its users run it with torchrun,
nothing of ddp-operator imported: a linear model on random data, with a snapshot that a restarted run
resumes from.

    command: [torchrun, torchrun_train.py, "20", "5"]     # total epochs, save every; --batch_size 32

torchrun takes --nnodes, --nproc-per-node, --node-rank, --master-addr and --master-port from the pod's
PET_* settings and starts the pod's ranks with RANK, LOCAL_RANK and WORLD_SIZE.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import time

import torch
import torch.nn.functional as F
from torch.distributed import destroy_process_group, get_rank, get_world_size, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class MyTrainDataset(Dataset):
    def __init__(self, size: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.data = [(torch.rand(20, generator=generator), torch.rand(1, generator=generator)) for _ in range(size)]

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data[index]


class Trainer:
    def __init__(self, model: torch.nn.Module, train_data: DataLoader, optimizer: torch.optim.Optimizer,
                 save_every: int, snapshot_path: str, step_seconds: float, pad_mb: int = 0,
                 save_mb_per_second: float = 0.0) -> None:
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
        self.model = model
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        self.snapshot_path = snapshot_path
        self.step_seconds = step_seconds
        self.pad_mb = pad_mb
        self.save_mb_per_second = save_mb_per_second
        if os.path.exists(snapshot_path):
            print("Loading snapshot")
            self._load_snapshot(snapshot_path)
        self.model = DDP(self.model)

    def _load_snapshot(self, snapshot_path: str) -> None:
        snapshot = torch.load(snapshot_path, map_location="cpu")
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"Resuming training from snapshot at Epoch {self.epochs_run}")
        print(json.dumps({"event": "resume", "rank": self.global_rank, "epochs_run": self.epochs_run}), flush=True)

    def _run_batch(self, source: torch.Tensor, targets: torch.Tensor) -> float:
        self.optimizer.zero_grad()
        loss = F.mse_loss(self.model(source), targets)
        loss.backward()
        self.optimizer.step()
        time.sleep(self.step_seconds)
        return loss.item()

    def _run_epoch(self, epoch: int) -> None:
        batch_size = len(next(iter(self.train_data))[0])
        print(f"[GPU{self.global_rank}] Epoch {epoch} | Batchsize: {batch_size} | Steps: {len(self.train_data)}")
        self.train_data.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
        for step, (source, targets) in enumerate(self.train_data):
            loss = self._run_batch(source, targets)
            if self.global_rank == 0:
                print(json.dumps({"loss": loss, "epoch": epoch, "step": epoch * len(self.train_data) + step + 1}),
                      flush=True)

    def _save_snapshot(self, epoch: int) -> None:
        snapshot = {"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epoch}
        if self.pad_mb:  # a larger model's snapshot
            snapshot["PADDING"] = torch.zeros(self.pad_mb * 1024 * 1024 // 4)
        os.makedirs(os.path.dirname(self.snapshot_path) or ".", exist_ok=True)
        if self.save_mb_per_second:
            save_slowly(snapshot, self.snapshot_path, self.save_mb_per_second)
        else:
            torch.save(snapshot, self.snapshot_path)
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}")

    def train(self, max_epochs: int) -> None:
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.global_rank == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch)


def save_slowly(snapshot: dict, path: str, mb_per_second: float) -> None:
    """torch.save onto a slow disk: the file is written in 1 MB pieces at most `mb_per_second`."""
    buffer = io.BytesIO()
    torch.save(snapshot, buffer)
    data, piece = buffer.getbuffer(), 1 << 20
    with open(path, "wb") as out:
        for start in range(0, len(data), piece):
            out.write(data[start:start + piece])
            out.flush()
            time.sleep(piece / (mb_per_second * (1 << 20)))


def main() -> None:
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int, help="Total epochs to train the model")
    parser.add_argument("save_every", type=int, help="How often to save a snapshot")
    parser.add_argument("--batch_size", default=32, type=int, help="Input batch size on each device (default: 32)")
    parser.add_argument("--step-seconds", default=0.0, type=float, help="pace each step (to watch it run)")
    parser.add_argument("--snapshot-path", default="/tmp/snapshot.pt", help="where rank 0 saves the snapshot")
    parser.add_argument("--pad-mb", default=0, type=int, help="make each snapshot this many MB larger")
    parser.add_argument("--save-mb-per-second", default=0.0, type=float, help="write snapshots this slowly (0: at once)")
    args = parser.parse_args()
    init_process_group(backend="gloo")
    torch.manual_seed(0)
    dataset = MyTrainDataset(2048)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=False, sampler=DistributedSampler(dataset))
    model = torch.nn.Linear(20, 1)
    trainer = Trainer(model, loader, torch.optim.SGD(model.parameters(), lr=1e-3), args.save_every,
                      args.snapshot_path, args.step_seconds, args.pad_mb, args.save_mb_per_second)
    trainer.train(args.total_epochs)
    flat = torch.cat([p.detach().flatten() for p in model.parameters()]).numpy().tobytes()
    print(json.dumps({"event": "params", "rank": get_rank(), "world_size": get_world_size(),
                      "digest": hashlib.sha256(flat).hexdigest()}), flush=True)
    destroy_process_group()


if __name__ == "__main__":
    main()
