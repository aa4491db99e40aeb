"""What the examples' trainers share: their common arguments, the DDP wrapper, each step's
reports, held-out accuracy over all ranks, results.

Everything here is plain torch.distributed and the runtime's API; the examples import it to stay
short, not because the runtime needs it.
"""

from __future__ import annotations

import argparse
import io
import json
from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.parallel import DistributedDataParallel
from torch.optim.swa_utils import update_bn

from ddp_trainer import RankContext, S3ResultsHandler, default_reporter


def arguments(prog: str, epochs: int, batch_size: int, lr: float, workers: int | None = None) -> argparse.ArgumentParser:
    """The arguments every example takes (its DDPJob's `args`), with the example's defaults."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--epochs", type=int, default=epochs)
    parser.add_argument("--batch-size", type=int, default=batch_size, help="per rank")
    parser.add_argument("--lr", type=float, default=lr)
    parser.add_argument("--seed", type=int, default=0, help="initial weights and data order")
    if workers is not None:
        parser.add_argument("--workers", type=int, default=workers, help="DataLoader worker processes per rank")
    return parser


def distributed(model: nn.Module, ctx: RankContext) -> DistributedDataParallel:
    """`model` on the rank's device, wrapped in DDP (which copies rank 0's parameters to every rank)."""
    model.to(ctx.device)
    return DistributedDataParallel(model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)


class StepLog:
    """What every step reports: this rank's loss into its metrics in S3 (`S3ResultsHandler.log_metrics`)
    and, from rank 0, the gang's mean loss and samples/s into the job's status (`default_reporter`), with
    how far the run is when it knows its total steps."""

    def __init__(self, ctx: RankContext, step: int = 0, total_steps: int | None = None) -> None:
        self.results = S3ResultsHandler()
        self.progress = default_reporter(total_steps=total_steps)
        self.world_size = ctx.world_size
        self.step = step

    def record(self, epoch: int, loss: torch.Tensor, batch_size: int) -> float:
        """Counts the step; returns the gang's mean loss."""
        self.step += 1
        self.results.log_metrics(self.step, epoch, loss)
        mean = gang_mean(loss)
        self.progress.report(epoch, self.step, mean, samples=batch_size * self.world_size)
        return mean

    def close(self) -> None:
        self.progress.flush()
        self.results.close()


def gang_mean(value: torch.Tensor) -> float:
    """`value` averaged over every rank (an all-reduce), so rank 0 reports the job's loss, not its own."""
    total = value.detach().clone().float()
    dist.all_reduce(total)
    return total.item() / dist.get_world_size()


def gang_accuracy(model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
                  device: torch.device) -> tuple[float, int]:
    """(accuracy, samples) of `model` over every rank's share of a held-out set: counts are all-reduced."""
    model.eval()
    counts = torch.zeros(2, dtype=torch.long, device=device)
    with torch.no_grad():
        for inputs, labels in batches:
            inputs, labels = inputs.to(device), labels.to(device)
            counts[0] += (model(inputs).argmax(dim=1) == labels).sum()
            counts[1] += len(labels)
    model.train()
    dist.all_reduce(counts)
    correct, total = counts.tolist()
    return correct / max(total, 1), total


def recalibrate_batchnorm(model: nn.Module, batches: Iterable[Any], device: torch.device) -> None:
    """BatchNorm's running statistics recomputed for the final weights over `batches` (this rank's
    share of the training data), then pooled over the gang; nothing for a model without BatchNorm.

    During training they are an exponential average over the last ten or so batches, taken while the
    weights were still moving (fast, at these examples' learning rates): in eval mode they can
    describe weights that no longer exist, and the model then answers one class for every input,
    depending on which way the CPU's rounding steered training. Recomputed, the held-out accuracy
    measures the weights (the "precise BN" of torch.optim.swa_utils.update_bn).
    """
    norms = [m for m in model.modules() if isinstance(m, _BatchNorm)]
    if not norms:
        return
    update_bn(batches, model, device)
    world = dist.get_world_size()
    for norm in norms:
        assert norm.running_mean is not None and norm.running_var is not None
        # Pooled over ranks: the mean of the means, and of E[x^2] = var + mean^2.
        moments = torch.cat([norm.running_mean, norm.running_var + norm.running_mean**2])
        dist.all_reduce(moments)
        mean, second = (moments / world).chunk(2)
        norm.running_mean.copy_(mean)
        norm.running_var.copy_(second - mean**2)


def submit_evaluation(results: S3ResultsHandler, accuracy: float, samples: int, classes: int,
                      **extra: Any) -> None:
    """`results/eval.json`: the held-out accuracy next to chance, what a reader checks first."""
    record = {"accuracy": round(accuracy, 4), "samples": samples, "classes": classes,
              "chance": round(1 / classes, 4), **extra}
    results.submit_result("eval.json", json.dumps(record, indent=2))
    print(f"held-out accuracy {accuracy:.3f} on {samples} samples (chance {1 / classes:.3f})", flush=True)


def evaluate_and_submit(ctx: RankContext, log: StepLog, ddp: nn.Module, model: nn.Module,
                        held_out: Iterable[tuple[torch.Tensor, torch.Tensor]], classes: int,
                        train_batches: Iterable[Any] = (), **extra: Any) -> None:
    """How every classifier example ends: BatchNorm's statistics recomputed over `train_batches`, the
    held-out accuracy over all ranks, the step log closed, and from rank 0 `results/eval.json` (with
    `extra`) and `results/model.pt`."""
    recalibrate_batchnorm(model, train_batches, ctx.device)
    accuracy, samples = gang_accuracy(ddp, held_out, ctx.device)
    log.close()
    if ctx.rank == 0:
        submit_evaluation(log.results, accuracy, samples, classes, **extra)
        log.results.submit_result("model.pt", state_bytes(model.state_dict()))


def state_bytes(state: Mapping[str, Any]) -> bytes:
    """A state dict as `torch.save` bytes, for `submit_result`."""
    buffer = io.BytesIO()
    torch.save(dict(state), buffer)
    return buffer.getvalue()
