"""Training functions the tests run in every rank through `python -m ddp_trainer run`.

Configured by WL_* environment variables so the same code serves several tests; also holds the
single-process reference training used to check DDP equivalence. The real-node tests mount this file
into trainer containers (a ConfigMap), so it needs nothing but the runtime and torch.
"""

from __future__ import annotations

import atexit
import io
import json
import os
import signal
import time
from collections import Counter
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ddp_trainer.data.sampler import DistributedChunkedSampler
from ddp_trainer.runtime.context import RankContext
from ddp_trainer.runtime.progress import default_reporter
from ddp_trainer.storage.checkpoint import CheckpointManager, restore_training_state, training_state
from ddp_trainer.storage.results import S3ResultsHandler

SAMPLES = 96
FEATURES = 8
LR = 0.05
MOMENTUM = 0.9


def dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(SAMPLES, FEATURES, generator=generator)
    y = (x @ torch.linspace(-1, 1, FEATURES)).unsqueeze(1) + 0.1 * torch.randn(SAMPLES, 1, generator=generator)
    return TensorDataset(x, y)


def model() -> nn.Module:
    """FEATURES -> 16 -> 1; WL_WIDTH and WL_LAYERS (hidden layers of that width) make it larger, for
    states of a size to measure (8192 and 2: about 0.5 GB of parameters, as much again of momentum)."""
    torch.manual_seed(0)
    width, layers = _int("WL_WIDTH", 16), _int("WL_LAYERS", 0)
    hidden = [module for _ in range(layers) for module in (nn.Linear(width, width), nn.Tanh())]
    return nn.Sequential(nn.Linear(FEATURES, width), nn.Tanh(), *hidden, nn.Linear(width, 1))


def optimizer(net: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)


def sampler(world_size: int, rank: int) -> DistributedChunkedSampler:
    return DistributedChunkedSampler(SAMPLES, num_replicas=world_size, rank=rank, chunksize=8, seed=7)


def _index_record(ctx: RankContext) -> Any:
    """WL_INDICES: a directory where each rank of each attempt writes, per step, the samples its batch
    held as its sampler lists them (one JSON line a step), for tests of data accounting."""
    folder = os.environ.get("WL_INDICES")
    if not folder:
        return None
    record = open(os.path.join(folder, f"{os.environ.get('DDP_ATTEMPT', '0')}-{ctx.rank}.jsonl"), "a")
    atexit.register(record.close)
    return record


def kept_steps(folder: str) -> list[dict[str, Any]]:
    """The WL_INDICES records of the steps the final model trained on: each attempt's steps up to where
    the next attempt that trained resumed (the steps after that checkpoint were trained again)."""
    by_attempt: dict[int, list[dict[str, Any]]] = {}
    for name in os.listdir(folder):
        with open(os.path.join(folder, name)) as lines:
            by_attempt.setdefault(int(name.split("-")[0]), []).extend(json.loads(line) for line in lines if line.strip())
    attempts = sorted(by_attempt)
    kept: list[dict[str, Any]] = []
    for attempt, following in zip(attempts, [*attempts[1:], None], strict=True):
        resumed = min(r["step"] for r in by_attempt[following]) - 1 if following is not None else None
        kept += [r for r in by_attempt[attempt] if resumed is None or r["step"] <= resumed]
    return kept


def not_seen_once(steps: list[dict[str, Any]], epochs: int) -> dict[int, list[tuple[int, int]]]:
    """Per epoch, the samples the steps did not train on exactly once, with how often they did."""
    off: dict[int, list[tuple[int, int]]] = {}
    for epoch in range(epochs):
        seen = Counter(i for r in steps if r["epoch"] == epoch for i in r["indices"])
        wrong = sorted((i, seen[i]) for i in set(range(SAMPLES)) | set(seen) if seen[i] != 1)
        if wrong:
            off[epoch] = wrong
    return off


def _int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def train(ctx: RankContext) -> None:
    from torch.nn.parallel import DistributedDataParallel

    batch, epochs = _int("WL_BATCH", 4), _int("WL_EPOCHS", 2)
    every, crash_at = _int("WL_CKPT_EVERY", 0), _int("WL_CRASH_AT_STEP", -1)
    pace = float(os.environ.get("WL_STEP_SECONDS", "0"))  # slower steps, for faults from outside
    balloon_at = _int("WL_OOM_AFTER_STEPS", -1) if os.environ.get("WL_OOM_ON_ATTEMPT") == os.environ.get("DDP_ATTEMPT") else -1
    raise_at = _int("WL_RAISE_AT_STEP", -1) if os.environ.get("WL_RAISE_ON_ATTEMPT") == os.environ.get("DDP_ATTEMPT") else -1
    device = ctx.device  # cuda:LOCAL_RANK under nccl, else the CPU
    net = model().to(device)
    opt = optimizer(net)
    ddp = DistributedDataParallel(net, device_ids=[device.index] if device.type == "cuda" else None)
    data_sampler = sampler(ctx.world_size, ctx.rank)
    if os.environ.get("WL_DATA_WORKERS") == "1":  # the job's data workers make the batches
        import ddp_trainer

        loader: DataLoader = ddp_trainer.DataLoader(dataset(), batch_size=batch, sampler=data_sampler, num_workers=2)
    else:
        loader = DataLoader(dataset(), batch_size=batch, sampler=data_sampler)
    memory_every = _int("WL_MEMORY_EVERY", 0)  # snapshots in the pod's memory every so many steps
    checkpoints = CheckpointManager(keep=2, async_save=os.environ.get("WL_ASYNC") == "1",
                                    memory_every=memory_every or None) if every or memory_every else None
    results = S3ResultsHandler(flush_interval_s=5.0) if os.environ.get("DDP_RESULTS_URI") else None
    progress = default_reporter()
    step = 0
    if checkpoints is not None and memory_every:
        step = checkpoints.resume(ddp, opt, data_sampler)
        print(f"rank {ctx.rank} resumed from step {step}", flush=True)
    elif checkpoints is not None:
        latest = checkpoints.load_latest()
        if latest is not None:
            restore_training_state(latest.state, ddp, opt, data_sampler)
            step = latest.step
            print(f"rank {ctx.rank} resumed from step {step}", flush=True)
    loss_fn = nn.MSELoss()
    first_step = step
    record = _index_record(ctx)
    for epoch in range(data_sampler.epoch, epochs):
        data_sampler.set_epoch(epoch)
        consumed = data_sampler.start_offset  # workers prefetch: the sampler alone would over-count
        mine = data_sampler.rank_indices() if record else []
        for x, y in loader:
            consumed += len(x)
            if record:  # before the step: a rank killed after the gang's all-reduce trained on its batch
                print(json.dumps({"world": ctx.world_size, "epoch": epoch, "step": step + 1, "time": time.time(),
                                  "indices": mine[consumed - len(x):consumed]}), file=record, flush=True)
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            loss = loss_fn(ddp(x), y)
            loss.backward()
            opt.step()
            step += 1
            progress.report(epoch, step, loss.item(), samples=batch * ctx.world_size)
            if results is not None:
                results.log_metrics(step, epoch, loss, lr=LR)
            if checkpoints is not None and memory_every:
                checkpoints.snapshot(step, lambda: training_state(ddp, opt, data_sampler, samples_consumed=consumed))
            if checkpoints is not None and every and (step % every == 0 or checkpoints.requested()):
                checkpoints.save(step, training_state(ddp, opt, data_sampler, samples_consumed=consumed))
            if step == crash_at and ctx.rank == 0:
                os.kill(os.getpid(), signal.SIGKILL)
            if step == raise_at and ctx.rank == 1:
                raise RuntimeError(f"rank 1 fails at step {step} on attempt {os.environ['DDP_ATTEMPT']}")
            if step - first_step == balloon_at and ctx.rank == 1:
                print(f"rank 1 fills 2 GiB at step {step}", flush=True)
                torch.ones(512 * 1024 * 1024)  # past the container's memory limit: the kernel kills it
            time.sleep(pace)
    progress.flush()
    if checkpoints is not None:
        checkpoints.close()
    if results is not None:
        results.close()
    if ctx.rank == 0:
        params = {name: value.cpu() for name, value in net.state_dict().items()}
        if os.environ.get("WL_OUT"):
            torch.save(params, os.environ["WL_OUT"])
        if results is not None:
            results.submit_result("final.txt", f"steps={step}")
            buffer = io.BytesIO()
            torch.save(params, buffer)
            results.submit_result("params.pt", buffer.getvalue())


def reference(world_size: int, batch: int, epochs: int, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """One process replaying the gang's arithmetic: every step, each rank's batch's gradient computed
    apart, averaged as DDP's all-reduce averages them (each divided by the world size, then summed in
    rank order), and one SGD step. For two ranks the sum is the same in any order, so on the ranks'
    own torch build and CPU this is the gang's result to the bit; elsewhere only rounding differs.
    In float64 (`dtype`) it is the trajectory that float32 runs drift from by rounding."""
    x, y = (t.to(dtype) for t in dataset().tensors)
    net = model().to(dtype)
    opt = optimizer(net)
    loss_fn = nn.MSELoss()
    samplers = [sampler(world_size, r) for r in range(world_size)]
    for epoch in range(epochs):
        per_rank = []
        for s in samplers:
            s.set_epoch(epoch)
            per_rank.append(list(s))
        for start in range(0, len(per_rank[0]), batch):
            grads = []
            for indices in per_rank:
                net.zero_grad()
                loss_fn(net(x[indices[start : start + batch]]), y[indices[start : start + batch]]).backward()
                grads.append([p.grad.clone() for p in net.parameters() if p.grad is not None])
            for param, *each_rank in zip(net.parameters(), *grads, strict=True):
                total = each_rank[0] / world_size
                for grad in each_rank[1:]:
                    total = total + grad / world_size
                param.grad = total
            opt.step()
    return net.state_dict()


# How many rounding drifts a float32 gang may end from the replay. Two float32 runs of these steps that
# differ only in rounding (another kernel, summation order, vector width, CPU) end about one drift
# apart: the single-batch reference that sums all eight samples' gradients at once ends 1.4 drifts from
# the replay (AMD EPYC, torch 2.14.1). A real mistake moves the parameters by far more: one batch of
# the 72 skipped two steps from the end, 45,000 drifts; gradients summed instead of averaged, 2e7.
DRIFTS_ALLOWED = 10


def assert_matches_reference(params: dict[str, torch.Tensor], world_size: int, batch: int, epochs: int) -> None:
    """`params` (a float32 gang's) equal the replay of its arithmetic but for rounding: each within
    DRIFTS_ALLOWED times the drift of the float32 replay from the float64 one (its largest over every
    parameter, a few 1e-6 here), so the bound holds on any CPU, thread count or torch build."""
    expected = reference(world_size, batch, epochs)
    exact = reference(world_size, batch, epochs, torch.float64)
    assert params.keys() == expected.keys()
    drift = max((expected[n].double() - exact[n]).abs().max().item() for n in expected)
    for name in expected:
        off = (params[name].double().cpu() - exact[name]).abs().max().item()
        assert off <= DRIFTS_ALLOWED * drift, (
            f"{name}: {off:.3g} from the exact replay, more than {DRIFTS_ALLOWED} times the float32 replay's "
            f"rounding drift ({drift:.3g})")


def imports_of_a_first_step(ctx: RankContext) -> None:
    """Writes to WL_OUT the modules a first training step imports: a model, SGD and Adam made, a forward,
    a backward and each optimizer's step, an S3 client and a Kubernetes API client made."""
    import sys

    from ddp_trainer.storage import s3

    before = set(sys.modules)
    s3.client()
    from kubernetes import client  # the package imports its config too: rank 0's status writes use both

    client.ApiClient(client.Configuration())
    net = model()
    optimizers = [torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM), torch.optim.Adam(net.parameters())]
    x, y = dataset().tensors
    nn.MSELoss()(net(x), y).backward()
    for opt in optimizers:
        opt.step()
    with open(os.environ["WL_OUT"], "w") as out:
        json.dump(sorted(set(sys.modules) - before), out)


def fail(ctx: RankContext) -> Any:
    raise ValueError(f"user code failed in rank {ctx.rank}")


def fail_then_abort_at_exit(ctx: RankContext) -> None:
    """Fails like user code, and leaves behind what aborts the interpreter's teardown (as a backend's
    C++ threads may after a broken collective): the runtime must still exit with its own code."""
    atexit.register(os.abort)
    raise RuntimeError("the user's code failed")


def succeed_then_abort_in_teardown(ctx: RankContext) -> None:
    """Succeeds, leaving behind what aborts the process once the interpreter has finished (a C exit
    handler calling abort(), as a backend's C++ thread destructor may after a clean run: "terminate
    called without an active exception"), a non-daemon thread and an atexit handler that a clean exit
    still waits for and runs."""
    import ctypes
    import threading
    import time

    libc = ctypes.CDLL(None)
    getattr(libc, "__cxa_atexit")(ctypes.cast(libc.abort, ctypes.c_void_p), None, None)  # atexit(abort) in C
    out = os.environ["WL_OUT"]
    threading.Thread(target=lambda: (time.sleep(0.5), open(out, "a").write("thread\n"))).start()
    atexit.register(lambda: open(out, "a").write("atexit\n"))
    print(f"rank {ctx.rank} done", flush=True)


def nothing(ctx: RankContext) -> None:
    """User code that returns at once: what the runtime does around it shows alone."""


def use_collective(ctx: RankContext) -> None:
    """Rank 1 dies after the barrier; rank 0's all-reduce then fails, an infrastructure error, whether it
    began before rank 1 was gone (its peer closes the connection) or after (no peer to connect to)."""
    import torch.distributed as dist

    dist.barrier()
    if ctx.rank == 1:
        os._exit(0)
    dist.all_reduce(torch.ones(4))
    dist.all_reduce(torch.ones(4))


def stream_train(ctx: RankContext) -> None:
    """DDP over ShardStream with uneven shards and 2 loader workers: must not hang. With
    WL_CKPT_EVERY it checkpoints the stream's position too and resumes mid-epoch after a crash."""
    from torch.nn.parallel import DistributedDataParallel

    from ddp_trainer.data.shardstream import ShardStream

    batch, workers, epochs = 2, 2, 2
    every, crash_at = _int("WL_CKPT_EVERY", 0), _int("WL_CRASH_AT_STEP", -1)
    stream = ShardStream(os.environ["WL_INDEX"], seed=1, transform=lambda s: (torch.tensor(s["npy"]), float(s["cls"])))
    loader = DataLoader(stream, batch_size=batch, num_workers=workers, multiprocessing_context="fork")
    torch.manual_seed(0)
    net = DistributedDataParallel(nn.Linear(3, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.001, momentum=0.9)
    checkpoints = CheckpointManager(keep=2) if every else None
    step, done = 0, 0  # done: batches finished in the current epoch
    latest = checkpoints.load_latest() if checkpoints is not None else None
    if latest is not None:
        restore_training_state(latest.state, net, opt)
        stream.load_state_dict(latest.state["stream"])
        step, done = latest.step, stream.start_batch
        print(f"rank {ctx.rank} resumed from step {step} (epoch {stream.epoch}, batch {done})", flush=True)
    for epoch in range(stream.epoch, epochs):
        stream.set_epoch(epoch)
        batches = 0
        for x, y in loader:
            opt.zero_grad()
            nn.functional.mse_loss(net(x).squeeze(1), y.float()).backward()
            opt.step()
            step, done, batches = step + 1, done + 1, batches + 1
            if checkpoints is not None and step % every == 0:
                checkpoints.save(step, training_state(net, opt, stream=stream.state_dict(done, batch, workers)))
            if step == crash_at and ctx.rank == 0:
                os.kill(os.getpid(), signal.SIGKILL)
        done = 0
        print(f"rank {ctx.rank} epoch {epoch} batches {batches}", flush=True)
    if checkpoints is not None:
        checkpoints.close()
    if ctx.rank == 0 and os.environ.get("WL_OUT"):
        torch.save(net.module.state_dict(), os.environ["WL_OUT"])


def hang(ctx: RankContext) -> None:
    """Every rank all-reduces once per step; rank 1 stops calling the collective after step 3 (as a
    rank whose data loader died would), so rank 0 waits in the all-reduce of step 4."""
    import time

    import torch.distributed as dist

    reporter = default_reporter(ctx.rank)
    for step in range(1, 1000):
        reporter.report(0, step)
        if ctx.rank == 1 and step == 3:
            time.sleep(3600)
        dist.all_reduce(torch.ones(1))


def waits_on_a_data_worker(ctx: RankContext) -> None:
    """Steps 1 and 2, then a batch from the job's data workers ($DDP_DATA_WORKERS), which never comes."""
    from dataworkhelp import Augmented

    from ddp_trainer import DataLoader

    reporter = default_reporter(ctx.rank)
    reporter.report(0, 1)
    reporter.report(0, 2)
    for _ in DataLoader(Augmented(), batch_size=2, num_workers=1):
        reporter.report(0, 3)


def wait_for_sigterm(ctx: RankContext) -> None:
    """Says it is in the user's code (a file), then waits, as a long training step would."""
    import pathlib
    import time

    default_reporter(ctx.rank).report(0, 7)
    pathlib.Path(os.environ["WL_READY_FILE"]).write_text("ready")
    time.sleep(3600)


def fail_at_step(ctx: RankContext) -> None:
    """A deterministic bug: rank 1 raises at step 3 on every attempt."""
    import torch.distributed as dist

    reporter = default_reporter(ctx.rank)
    for step in range(1, 10):
        reporter.report(0, step)
        if ctx.rank == 1 and step == 3:
            raise ValueError("a bug that fires at step 3")
        dist.all_reduce(torch.ones(1))


def _loader_worker_says(index: int) -> int:
    print(f"a DataLoader worker printed item {index}", flush=True)
    return index


def chatty(ctx: RankContext) -> None:
    """Output of every kind a rank makes: print, stderr, logging, a DataLoader worker (forked), then
    (WL_FAIL=1) a traceback; with WL_READY_FILE it waits after saying so, for SIGTERM or SIGKILL."""
    import logging
    import pathlib
    import sys
    import time

    print(f"rank {ctx.rank} prints to stdout", flush=True)
    print(f"rank {ctx.rank} writes to stderr", file=sys.stderr, flush=True)
    logging.getLogger("user").warning("rank %d logs a warning", ctx.rank)
    loader = DataLoader(list(range(2)), batch_size=1, num_workers=1, multiprocessing_context="fork",
                        collate_fn=lambda items: [_loader_worker_says(i) for i in items])
    list(loader)
    if os.environ.get("WL_READY_FILE"):
        pathlib.Path(os.environ["WL_READY_FILE"]).write_text("ready")
        time.sleep(3600)
    if os.environ.get("WL_FAIL") == "1":
        raise RuntimeError(f"rank {ctx.rank} fails on purpose")


def prints_metrics(ctx: RankContext) -> None:
    """Training code that only prints its metrics, as dask-pytorch-ddp's examples (WL_STYLE=json:
    a JSON dict with loss, epoch, count, worker) or Hugging Face's Trainer (WL_STYLE=hf: a dict literal with
    loss, grad_norm, learning_rate and a fractional epoch) do, among lines that are none: JSON without a
    loss, a dict with strings for numbers, a truncated line and binary noise. WL_EXPLICIT=1 also reports
    through the reporter and log_metrics (which then win)."""
    import json
    import sys
    import time

    steps, style = _int("WL_STEPS", 12), os.environ.get("WL_STYLE", "json")
    pace = float(os.environ.get("WL_STEP_SECONDS", "0"))
    explicit = os.environ.get("WL_EXPLICIT") == "1"
    reporter = default_reporter() if explicit else None
    results = S3ResultsHandler() if explicit and os.environ.get("DDP_RESULTS_URI") else None
    for count in range(1, steps + 1):
        loss, epoch = 1.0 / count, (count - 1) // 4
        if style == "hf":
            print({"loss": round(loss, 4), "grad_norm": 2.0 * loss, "learning_rate": 5e-05, "epoch": count / 4})
        else:
            print(json.dumps({"loss": loss, "epoch": epoch, "count": count, "worker": ctx.rank}))
        print(json.dumps({"accuracy": 0.5, "count": count}))  # no loss
        print("{'loss': 'low', 'step': 3}")  # strings where numbers belong
        print('{"loss": 0.5, "st', flush=True)  # truncated
        sys.stdout.buffer.write(b"\x00\xff\xfe{loss\x80}\n")
        sys.stdout.flush()
        if reporter is not None:
            reporter.report(epoch, count * 100, loss=loss * 10)
        if results is not None:
            results.log_metrics(count * 100, epoch, loss * 10)
        time.sleep(pace)
    if results is not None:
        results.close()
