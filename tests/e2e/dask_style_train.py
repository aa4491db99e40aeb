"""The dask-pytorch-ddp transfer-learning example's training function, ported by changing its imports
(a small network instead of resnet18, so that it trains on a CPU in seconds):

    - from dask_pytorch_ddp.data import S3ImageFolder
    - from dask_pytorch_ddp.results import DaskResultsHandler
    + from ddp_trainer import S3ImageFolder
    + from ddp_trainer import DaskResultsHandler

`dispatch.run(client, train)` becomes `ddp_client.submit("dask_style_train.py", ...)` (the runtime has
initialised the process group when the script runs) and `rh.process_results(prefix, futures)`
becomes `ddp_client.process_results(job, prefix)`. Two lines are additions, marked: per-step
metrics for `job.metrics()`/`job.plot()` and progress for `job.wait()`'s progress line.
"""

from __future__ import annotations

import datetime
import json
import pickle
import sys
import uuid

import torch
import torch.distributed as dist
from torch import nn, optim
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torchvision import transforms

from ddp_trainer import DaskResultsHandler, S3ImageFolder, default_reporter

transform = transforms.Compose([transforms.Resize(32), transforms.ToTensor()])
key = uuid.uuid4().hex
rh = DaskResultsHandler(key)


def train(bucket: str, prefix: str, n_epochs: int, batch_size: int) -> None:
    worker_rank = int(dist.get_rank())
    device = torch.device("cpu")  # dask-pytorch-ddp's: torch.device(0), each worker's first visible GPU
    whole_dataset = S3ImageFolder(s3_bucket=bucket, s3_prefix=prefix, transform=transform)
    train_sampler = DistributedSampler(whole_dataset)
    train_loader = DataLoader(whole_dataset, sampler=train_sampler, batch_size=batch_size, num_workers=0)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                        nn.Linear(128, len(whole_dataset.classes)))
    model = DDP(net.to(device))
    criterion = nn.CrossEntropyLoss()
    optimizer = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    progress = default_reporter()  # added: progress in the job's status
    count = 0
    for epoch in range(n_epochs):
        train_sampler.set_epoch(epoch)
        model.train()
        for inputs, labels in train_loader:
            inputs, labels = inputs.to(device), labels.to(device)
            outputs = model(inputs)
            _, preds = torch.max(outputs, 1)
            loss = criterion(outputs, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            count += 1
            print(json.dumps({"loss": loss.item(), "epoch": epoch, "count": count, "worker": worker_rank}), flush=True)
            rh.log_metrics(count, epoch, loss.item(), accuracy=(preds == labels).float().mean().item())  # added
            progress.report(epoch, count, loss.item(), samples=len(labels) * dist.get_world_size())
        rh.submit_result(
            f"logs/data_{worker_rank}_{epoch}.json",
            json.dumps({"loss": loss.item(), "time": datetime.datetime.now().isoformat(), "epoch": epoch,
                        "worker": worker_rank}),
        )
    if worker_rank == 0:
        rh.submit_result(path="model.pkl", data=pickle.dumps(model.state_dict()))
    progress.flush()
    rh.close()


if __name__ == "__main__":
    train(sys.argv[1], sys.argv[2], n_epochs=int(sys.argv[3]), batch_size=int(sys.argv[4]))
