"""The runtime's DataLoader with real data worker processes (`python -m ddp_trainer data-worker`) on
loopback: the batches a local torch DataLoader makes, in its order, through lost workers too."""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from dataworkhelp import Augmented, Large, Stream, init_worker
from torch.utils.data import DataLoader as TorchDataLoader
from trainerhelp import rank_env

from ddp_trainer import DataLoader, DistributedChunkedSampler, DpexDataLoader, wire
from ddp_trainer.data import loader as loader_module
from ddp_trainer.errors import ConfigError
from kube import wait_until

TOKEN = "a-token-of-this-job"
# The tests ask for 3 workers on 2 cores on purpose (3 logical workers over 2 data workers).
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


class Worker:
    def __init__(self, token: str = TOKEN) -> None:
        env = rank_env({}, 0, 1, 0)
        env["DDP_DATA_WORKER_TOKEN"] = token
        self.process = subprocess.Popen([sys.executable, "-m", "ddp_trainer", "data-worker", "--port", "0"],
                                        env=env, stderr=subprocess.PIPE, text=True, start_new_session=True)
        assert self.process.stderr is not None
        for line in self.process.stderr:
            found = re.search(r"data worker listening on (\S+)", line)
            if found:
                self.address = found.group(1)
                break
        else:
            raise AssertionError(f"the data worker exited {self.process.wait()} before listening")
        threading.Thread(target=self.process.stderr.read, daemon=True).start()  # never let its pipe fill

    def kill(self) -> None:
        """SIGKILL to the worker and its sessions, as an OOM kill or a deleted pod ends them."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.kill()


def start(workers: list[Worker], n: int) -> list[str]:
    workers.extend(Worker() for _ in range(n))
    return [w.address for w in workers]


def epochs(loader: Any, n: int) -> list[Any]:
    return [batch for _ in range(n) for batch in loader]


def assert_same_batches(got: list[Any], expected: list[Any]) -> None:
    assert len(got) == len(expected)
    for i, ((x, y), (ex, ey)) in enumerate(zip(got, expected, strict=True)):
        assert torch.equal(y, ey), f"batch {i}: labels {y.tolist()} != {ey.tolist()}"
        assert torch.equal(x, ex), f"batch {i}: samples differ"


def arguments(**more: Any) -> dict[str, Any]:
    return dict(batch_size=5, shuffle=True, num_workers=3, prefetch_factor=2, worker_init_fn=init_worker,
                generator=torch.Generator().manual_seed(7), **more)


@pytest.mark.parametrize("persistent", [False, True])
def test_batches_equal_a_local_dataloaders_with_random_augmentation_over_epochs(
        workers: list[Worker], persistent: bool) -> None:
    endpoints = start(workers, 2)
    expected = epochs(TorchDataLoader(Augmented(), **arguments(persistent_workers=persistent)), 2)
    loader = DataLoader(Augmented(), data_workers=endpoints, data_worker_token=TOKEN,
                        **arguments(persistent_workers=persistent))
    assert loader.remote_endpoints() == endpoints
    got = epochs(loader, 2)
    assert_same_batches(got, expected)
    # Made there: each label carries the id of the worker that made it (99 would be this process).
    assert {int(y) % 10 for _, ys in got for y in ys} == {0, 1, 2}


def test_a_data_worker_killed_mid_epoch_changes_no_batch(workers: list[Worker], caplog: pytest.LogCaptureFixture) -> None:
    endpoints = start(workers, 2)
    expected = epochs(TorchDataLoader(Augmented(), **arguments()), 1)
    got = []
    for i, batch in enumerate(DataLoader(Augmented(), data_workers=endpoints, data_worker_token=TOKEN, **arguments())):
        got.append(batch)
        if i == 4:  # with batches of the killed worker's in flight
            workers[0].kill()
    assert_same_batches(got, expected)
    moved = [r.getMessage() for r in caplog.records if "going on elsewhere" in r.getMessage()]
    assert len(moved) == 2, moved  # logical workers 0 and 2 were on the killed one


def test_with_no_data_worker_left_the_batches_are_made_here_and_stay_the_same(
        workers: list[Worker], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(loader_module, "DATA_WORKER_WAIT_SECONDS", 0.5)
    endpoints = start(workers, 1)
    expected = epochs(TorchDataLoader(Augmented(), **arguments()), 1)
    torch.manual_seed(123)
    rank_draw_expected = torch.rand(3)
    torch.manual_seed(123)
    got = []
    for i, batch in enumerate(DataLoader(Augmented(), data_workers=endpoints, data_worker_token=TOKEN, **arguments())):
        got.append(batch)
        if i == 2:
            workers[0].kill()
    assert_same_batches(got, expected)
    assert sum("goes on in this process" in r.getMessage() for r in caplog.records) == 3
    # The rank's own random stream was set aside while its workers' ran here.
    assert torch.equal(torch.rand(3), rank_draw_expected)


def test_a_dataset_error_on_a_data_worker_reaches_the_rank_as_its_type_naming_the_samples(
        workers: list[Worker]) -> None:
    endpoints = start(workers, 1)
    loader = DataLoader(Augmented(fail_at=13), data_workers=endpoints, data_worker_token=TOKEN,
                        batch_size=4, num_workers=2)
    batches = iter(loader)
    for _ in range(3):
        next(batches)
    with pytest.raises(KeyError, match=r"sample 13 is missing") as raised:
        next(batches)
    assert re.search(r"fetching samples \[12, 13, 14, 15\]", str(raised.value)), str(raised.value)
    _, labels = next(batches)  # as torch's iterator: the batches after it still come
    assert [int(y) // 10 for y in labels] == [16, 17, 18, 19]


def test_a_peer_without_the_token_is_refused_and_the_worker_goes_on(workers: list[Worker]) -> None:
    (endpoint,) = start(workers, 1)
    host, port = wire.parse_address(endpoint)
    with pytest.raises(multiprocessing.AuthenticationError):
        wire.connect(host, port, b"another job's token")
    loader = DataLoader(Augmented(), data_workers=[endpoint], data_worker_token=TOKEN, **arguments())
    assert_same_batches(epochs(loader, 1), epochs(TorchDataLoader(Augmented(), **arguments()), 1))


def test_without_data_workers_it_is_torchs_dataloader(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DDP_DATA_WORKERS", raising=False)
    loader = DataLoader(Augmented(), **arguments())
    assert loader.remote_endpoints() == []
    assert type(iter(loader)).__name__ == "_MultiProcessingDataLoaderIter"
    monkeypatch.setenv("DDP_DATA_WORKERS", "127.0.0.1:9")
    assert DataLoader(Augmented(), **arguments(), distribute_mode=False).remote_endpoints() == []
    assert DpexDataLoader(Augmented(), False, "auto", 5).remote_endpoints() == []
    assert DataLoader(Augmented(), batch_size=5).remote_endpoints() == []  # num_workers=0
    assert DpexDataLoader(Augmented(), distribute_mode=True, num_workers=2).remote_endpoints() == ["127.0.0.1:9"]


def test_data_workers_without_the_token_or_with_a_bad_address_are_refused_by_name(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DDP_DATA_WORKER_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="DDP_DATA_WORKER_TOKEN"):
        iter(DataLoader(Augmented(), data_workers=["127.0.0.1:9"], num_workers=1))
    with pytest.raises(ValueError, match="'data-0' is not host:port"):
        DataLoader(Augmented(), data_workers=["data-0"], num_workers=1).remote_endpoints()


def test_a_data_worker_makes_the_next_batch_while_the_last_waits_for_the_rank(
        workers: list[Worker], tmp_path: Path) -> None:
    """As a local worker goes on while its batch waits in shared memory: the rank has asked for two
    batches and read none, and the second is made while the first (32 MB) waits to be sent."""
    endpoints = start(workers, 1)
    loader = DataLoader(Large(str(tmp_path)), data_workers=endpoints, data_worker_token=TOKEN, num_workers=1,
                        batch_size=1, prefetch_factor=2)
    batches = iter(loader)
    wait_until(lambda: (tmp_path / "1").exists(), 30, "the data worker to make batch 1 before batch 0 is read")
    assert [float(batch[0, 0]) for batch in batches] == [0.0, 1.0, 2.0, 3.0]


def test_a_dataset_that_cannot_be_sent_is_refused_with_what_to_do(workers: list[Worker]) -> None:
    endpoints = start(workers, 1)
    loader = DataLoader(Augmented(), data_workers=endpoints, data_worker_token=TOKEN, num_workers=1, batch_size=2,
                        collate_fn=lambda batch: batch)
    with pytest.raises(ConfigError, match="cannot be sent to the data workers .*module's top level"):
        iter(loader)


def test_a_loader_resumed_mid_epoch_from_its_samplers_state_makes_the_batches_a_local_one_makes(
        workers: list[Worker]) -> None:
    """Resume as a restarted gang does: the sampler's state (kept in the checkpoint) after 4 batches,
    loaded into a new loader; the rest of the epoch, and the next, as with local workers."""
    endpoints = start(workers, 2)

    def resumed(remote: bool) -> list[Any]:
        def loader(sampler: DistributedChunkedSampler) -> Any:
            kwargs = dict(batch_size=5, sampler=sampler, num_workers=3, generator=torch.Generator().manual_seed(3))
            if remote:
                return DataLoader(Augmented(), data_workers=endpoints, data_worker_token=TOKEN, **kwargs)
            return TorchDataLoader(Augmented(), **kwargs)

        sampler = DistributedChunkedSampler(64, num_replicas=2, rank=1, chunksize=8, seed=5)
        for i, _ in enumerate(loader(sampler)):
            if i == 3:
                break
        state = sampler.state_dict(samples_consumed=4 * 5)
        again = DistributedChunkedSampler(64, num_replicas=2, rank=1, chunksize=8, seed=5)
        again.load_state_dict(state)
        rest = list(loader(again))
        again.set_epoch(again.epoch + 1)
        return rest + list(loader(again))

    got, expected = resumed(remote=True), resumed(remote=False)
    assert len(got) == 3 + 7  # the 12 of its 32 samples left in batches of 5, then the next epoch's 32
    assert_same_batches(got, expected)


def test_a_dataset_from_a_scripts_folder_is_found_on_the_data_worker(
        workers: list[Worker], tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """`script.py:function` imports the script from its folder, which the rank puts on sys.path; a data
    worker (whose pod mounts the same code) is not started from there, and finds it from the rank's."""
    (tmp_path / "myscript_dataset.py").write_text(
        "import torch\n"
        "class Squares(torch.utils.data.Dataset):\n"
        "    def __len__(self):\n        return 12\n"
        "    def __getitem__(self, i):\n        return torch.tensor([i * i + torch.rand(()).item()])\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from myscript_dataset import Squares  # type: ignore[import-not-found]

    endpoints = start(workers, 1)
    remote = DataLoader(Squares(), data_workers=endpoints, data_worker_token=TOKEN, num_workers=2, batch_size=3,
                        generator=torch.Generator().manual_seed(3))
    local = TorchDataLoader(Squares(), num_workers=2, batch_size=3, generator=torch.Generator().manual_seed(3))
    got, expected = list(remote), list(local)
    assert len(got) == 4 and all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


def stream_arguments(**more: Any) -> dict[str, Any]:
    return dict(batch_size=4, num_workers=3, prefetch_factor=2, worker_init_fn=init_worker,
                generator=torch.Generator().manual_seed(11), **more)


@pytest.mark.parametrize("persistent", [False, True])
def test_an_iterable_dataset_streams_from_data_workers_as_from_local_workers(
        workers: list[Worker], persistent: bool) -> None:
    """As ShardStream runs there: each logical worker iterates its own copy, split by get_worker_info(),
    batches taken in turn; two epochs, a persistent worker's second a new iterator on the same streams."""
    endpoints = start(workers, 2)
    expected = epochs(TorchDataLoader(Stream(), **stream_arguments(persistent_workers=persistent)), 2)
    loader = DataLoader(Stream(), data_workers=endpoints, data_worker_token=TOKEN,
                        **stream_arguments(persistent_workers=persistent))
    assert loader.remote_endpoints() == endpoints  # made there, not in this process
    got = epochs(loader, 2)
    assert len(expected) == 24
    assert_same_batches(got, expected)


def test_an_iterable_stream_whose_workers_end_unevenly_yields_every_sample_once(workers: list[Worker]) -> None:
    """Worker 0 streams two samples more: when the others have ended, its last batches still come,
    and every sample comes once (torch's own order past the first end depends on timing too)."""
    endpoints = start(workers, 2)
    got = epochs(DataLoader(Stream(uneven=True), data_workers=endpoints, data_worker_token=TOKEN,
                            **stream_arguments()), 1)
    expected = epochs(TorchDataLoader(Stream(uneven=True), **stream_arguments()), 1)
    labels = sorted(int(y) // 10 for _, ys in got for y in ys)
    assert labels == list(range(50)) == sorted(int(y) // 10 for _, ys in expected for y in ys)
    assert_same_batches(got[:12], expected[:12])  # until the first worker's stream ends


def test_an_iterable_streams_data_worker_killed_mid_epoch_changes_no_batch(
        workers: list[Worker], caplog: pytest.LogCaptureFixture) -> None:
    """A stream cannot be set to a random state mid-way: the moved logical workers start their epoch
    again elsewhere and drop what they had delivered, so the batches stay the same."""
    endpoints = start(workers, 2)
    expected = epochs(TorchDataLoader(Stream(), **stream_arguments()), 1)
    got = []
    for i, batch in enumerate(DataLoader(Stream(), data_workers=endpoints, data_worker_token=TOKEN,
                                         **stream_arguments())):
        got.append(batch)
        if i == 4:
            workers[0].kill()
    assert_same_batches(got, expected)
    assert sum("going on elsewhere" in r.getMessage() for r in caplog.records) == 2
