"""A Hugging Face Trainer script as its users write it, nothing of ddp-operator imported: a tiny GPT-2
made from its config (no download) learns to continue sequences of tokens.

    command: [torchrun, hf_trainer.py]      # or [python, hf_trainer.py], or entrypoint: hf_trainer:main

The Trainer takes its world from the environment (torchrun's, or the pod's RANK/WORLD_SIZE/LOCAL_RANK)
and prints its log dicts and its progress bar, which ddp-operator reads for the job's progress. With
--save-steps it checkpoints into --output-dir and, started again, resumes from the newest checkpoint
there, as Trainer users write it (keepFolders keeps that folder across pods).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time

import torch
import torch.distributed as dist
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments, set_seed
from transformers.trainer_utils import get_last_checkpoint


class Sequences(Dataset):
    """Sequences that count up from a random start, modulo the vocabulary: easy to learn."""

    def __init__(self, count: int, length: int, vocab: int, seed: int) -> None:
        start = torch.randint(0, vocab, (count, 1), generator=torch.Generator().manual_seed(seed))
        self.ids = (start + torch.arange(length)) % vocab

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-dir", default="/tmp/hf-output")
    parser.add_argument("--epochs", type=float, default=3)
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--no-bar", action="store_true", help="disable_tqdm: no progress bar")
    parser.add_argument("--save-steps", type=int, default=0, help="checkpoint every N steps (0: never), keep 2")
    parser.add_argument("--step-seconds", type=float, default=0.0, help="sleep after each step (a slower model)")
    args = parser.parse_args()
    set_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2,
                                       bos_token_id=0, eos_token_id=0))
    saving = {"save_strategy": "steps", "save_steps": args.save_steps, "save_total_limit": 2} if args.save_steps else \
        {"save_strategy": "no"}
    training = TrainingArguments(output_dir=args.output_dir, num_train_epochs=args.epochs, per_device_train_batch_size=8,
                                 learning_rate=3e-3, logging_steps=4, report_to="none", use_cpu=True,
                                 ddp_backend="gloo", disable_tqdm=args.no_bar, seed=0, data_seed=0, **saving)
    trainer = Trainer(model=model, args=training, train_dataset=Sequences(args.samples, 16, 64, seed=1),
                      callbacks=[Pause(args.step_seconds)] if args.step_seconds else None)
    last = get_last_checkpoint(args.output_dir) if args.save_steps and os.path.isdir(args.output_dir) else None
    print(json.dumps({"event": "resume", "rank": int(os.environ.get("RANK", "0")), "from": last}), flush=True)
    trainer.train(resume_from_checkpoint=last)
    print_params(model, trainer.state.global_step)
    # No rank starts to exit while another still works: gloo's threads let go of the backward pass's last
    # all-reduces while the barrier waits (they need the GIL, which an exiting interpreter no longer hands
    # out: the process could abort with "terminate called without an active exception").
    trainer.accelerator.wait_for_everyone()


class Pause(TrainerCallback):
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        time.sleep(self.seconds)


def print_params(model: torch.nn.Module, step: int | None = None) -> None:
    """Every rank's world and a digest of its parameters (and the optimizer steps taken, where given): one
    model across the gang has one digest."""
    flat = torch.cat([p.detach().flatten() for p in model.parameters()]).numpy().tobytes()
    world, rank = (dist.get_world_size(), dist.get_rank()) if dist.is_initialized() else (1, 0)
    print(json.dumps({"event": "params", "rank": rank, "world_size": world, "digest": hashlib.sha256(flat).hexdigest(),
                      **({"global_step": step} if step is not None else {})}), flush=True)


if __name__ == "__main__":
    main()
