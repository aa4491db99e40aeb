"""The pipeline `bench_dataworkers.py` times, shipped to its pods in a ConfigMap: JPEG images decoded and
augmented at 224 px (RandomResizedCrop, flip, colour jitter, normalise), as an ImageNet-style job's
DataLoader workers do, and a consumer that takes batches as fast as they come (a GPU that is never
the bottleneck) and prints how many samples a second it got.

    python -c "import dataworker_pipeline; dataworker_pipeline.main(WORKERS, SECONDS)"

($DDP_DATA_WORKERS: on data workers, else local.) Imported rather than run as a script, so that the
dataset's class is `dataworker_pipeline.Jpegs`, which the data workers import, not `__main__.Jpegs`.
"""

from __future__ import annotations

import io
import json
import time

import torch
from PIL import Image
from torch.utils.data import Dataset
from torchvision import transforms

from ddp_trainer import DataLoader

IMAGES = 64  # distinct JPEGs, 256 x 256, cycled
SAMPLES = 100_000  # more than any run reads
BATCH = 16
AUGMENT = transforms.Compose([
    transforms.RandomResizedCrop(224),
    transforms.RandomHorizontalFlip(),
    transforms.ColorJitter(0.4, 0.4, 0.4),
    transforms.ToTensor(),
    transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
])


def jpeg(seed: int) -> bytes:
    generator = torch.Generator().manual_seed(seed)
    ramp = torch.linspace(0, 255, 256).expand(256, 256)
    noise = torch.rand(3, 256, 256, generator=generator) * 80
    pixels = (ramp.unsqueeze(0) * torch.rand(3, 1, 1, generator=generator) + noise).clamp(0, 255).to(torch.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels.permute(1, 2, 0).numpy()).save(out, format="JPEG", quality=90)
    return out.getvalue()


class Jpegs(Dataset[tuple[torch.Tensor, int]]):
    def __init__(self) -> None:
        self.files = [jpeg(i) for i in range(IMAGES)]

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = Image.open(io.BytesIO(self.files[index % IMAGES])).convert("RGB")
        return AUGMENT(image), index % 10


def main(workers: int, seconds: float, warmup: float = 5.0) -> None:
    loader = DataLoader(Jpegs(), batch_size=BATCH, shuffle=True, num_workers=workers, prefetch_factor=2)
    started = time.monotonic()
    counted_from, samples = None, 0
    for images, _ in loader:
        now = time.monotonic()
        if counted_from is None:
            if now - started >= warmup:
                counted_from = now
            continue
        samples += len(images)
        if now - counted_from >= seconds:
            break
    assert counted_from is not None, "no batch came within the warm-up"
    print(json.dumps({"samples_per_s": samples / (time.monotonic() - counted_from), "workers": workers}), flush=True)

