"""Pet names (examples/petnames): dask-pytorch-ddp's character LSTM, trained with DDP.

The names list is one text object ($DDP_DATASET_URI, one name a line). Every partial name
(`"bu"`, `"bus"`, ... with `+` as the stop character) becomes a sample: the last 8 characters,
one-hot, and the same shifted by one as the targets. Each rank trains on its DistributedSampler
share, logs its loss per step (S3 metrics) and rank 0 reports the gang's mean loss into the job's
status. At the end rank 0 samples new names from the model and stores them with the results
handler as `results/names.json`, with the model as `results/model.pt`.

    python -m ddp_trainer run petnames:main -- --epochs 12 --names 50
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ddp_trainer import RankContext, urls
from ddp_trainer.env import dataset_uri
from examplekit import StepLog, arguments, distributed, state_bytes

# `*` pads a partial name on the left, `+` ends a name; the rest may appear in names.
CHARACTERS = "*+abcdefghijklmnopqrstuvwxyz-. "
PAD, STOP = 0, 1
STR_LEN = 8
MAX_NAME = 30


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = arguments("petnames", epochs=12, batch_size=64, lr=0.003)
    parser.add_argument("--hidden", type=int, default=128, help="LSTM size (dask-pytorch-ddp's: 128)")
    parser.add_argument("--layers", type=int, default=2, help="LSTM layers (dask-pytorch-ddp's: 4)")
    parser.add_argument("--names", type=int, default=50, help="how many names to generate at the end")
    return parser.parse_args(argv)


def read_names(uri: str) -> list[str]:
    """The names at `uri`, lower case; a name with a character the model does not know is refused."""
    names = [line.strip().lower() for line in urls.read_bytes(uri).decode().splitlines()]
    names = [name for name in names if name and not name.startswith("#")]
    for name in names:
        unknown = set(name) - set(CHARACTERS[2:])
        if unknown:
            raise ValueError(f"{uri}: the name {name!r} has characters outside {CHARACTERS[2:]!r}: {sorted(unknown)}")
    if not names:
        raise ValueError(f"{uri} holds no names")
    return names


def encode(names: list[str]) -> TensorDataset:
    """(one-hot last STR_LEN characters of each partial name, the next character at each place)."""
    rows = []
    for name in names:
        text = name + CHARACTERS[STOP]
        for end in range(1, len(text) + 1):
            window = text[max(0, end - STR_LEN - 1) : end]
            padded = CHARACTERS[PAD] * (STR_LEN + 1 - len(window)) + window
            rows.append([CHARACTERS.index(c) for c in padded])
    numeric = torch.tensor(rows)
    inputs = nn.functional.one_hot(numeric[:, :-1], num_classes=len(CHARACTERS)).float()
    return TensorDataset(inputs, numeric[:, 1:])


class Model(nn.Module):
    def __init__(self, hidden: int, layers: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(input_size=len(CHARACTERS), hidden_size=hidden, num_layers=layers,
                            batch_first=True, dropout=0.1 if layers > 1 else 0.0)
        self.fc = nn.Linear(hidden, len(CHARACTERS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output, _ = self.lstm(x)
        return self.fc(output)


def generate_name(model: nn.Module, generator: torch.Generator) -> str:
    """One name, a character at a time, sampled from the model until it says stop (never an empty name)."""
    name = ""
    while len(name) < MAX_NAME:
        window = (CHARACTERS[PAD] * STR_LEN + name)[-STR_LEN:]
        x = nn.functional.one_hot(torch.tensor([[CHARACTERS.index(c) for c in window]]), len(CHARACTERS)).float()
        with torch.no_grad():
            logits = model(x)[0, -1]
        logits[PAD] = float("-inf")
        if not name.strip():
            logits[STOP] = float("-inf")
        index = int(torch.multinomial(torch.softmax(logits, dim=0), 1, generator=generator))
        if index == STOP:
            break
        name += CHARACTERS[index]
    return name.strip().title()


def main(ctx: RankContext) -> None:
    args = parse_args(sys.argv[1:])
    names = read_names(dataset_uri())
    dataset = encode(names)
    sampler: DistributedSampler[Any] = DistributedSampler(
        dataset, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    if ctx.rank == 0:
        print(f"{len(names)} names, {len(dataset)} partial names, {len(loader)} steps an epoch per rank", flush=True)

    torch.manual_seed(args.seed)
    model = Model(args.hidden, args.layers)
    ddp = distributed(model, ctx)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()
    log = StepLog(ctx, total_steps=args.epochs * len(loader))
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for inputs, targets in loader:
            inputs, targets = inputs.to(ctx.device), targets.to(ctx.device)
            optimizer.zero_grad()
            loss = loss_fn(ddp(inputs).transpose(1, 2), targets)  # (batch, classes, sequence) for CrossEntropyLoss
            loss.backward()
            optimizer.step()
            mean = log.record(epoch, loss, len(targets))
        if ctx.rank == 0:
            print(f"epoch {epoch}: loss {mean:.4f}", flush=True)
    log.close()

    if ctx.rank == 0:
        model.cpu().eval()
        generator = torch.Generator().manual_seed(args.seed)
        generated = [generate_name(model, generator) for _ in range(args.names)]
        known = {name.title() for name in names}
        new = [name for name in generated if name not in known]
        log.results.submit_result("names.json", json.dumps({"names": generated, "new": new}, indent=2))
        log.results.submit_result("model.pt", state_bytes(model.state_dict()))
        print(f"{len(generated)} names ({len(new)} not in the training list): {', '.join(generated)}", flush=True)
