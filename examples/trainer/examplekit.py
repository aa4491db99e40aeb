"""What the examples' trainers share: the gang's mean loss, held-out accuracy over all ranks, results.

Everything here is plain torch.distributed; the examples import it to stay short, not because
the runtime needs it.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ddp_trainer import S3ResultsHandler


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


def submit_evaluation(results: S3ResultsHandler, accuracy: float, samples: int, classes: int,
                      **extra: Any) -> None:
    """`results/eval.json`: the held-out accuracy next to chance, what a reader checks first."""
    record = {"accuracy": round(accuracy, 4), "samples": samples, "classes": classes,
              "chance": round(1 / classes, 4), **extra}
    results.submit_result("eval.json", json.dumps(record, indent=2))
    print(f"held-out accuracy {accuracy:.3f} on {samples} samples (chance {1 / classes:.3f})", flush=True)


def state_bytes(state: Mapping[str, Any]) -> bytes:
    """A state dict as `torch.save` bytes, for `submit_result`."""
    buffer = io.BytesIO()
    torch.save(dict(state), buffer)
    return buffer.getvalue()
