"""Job.wait() against the local control plane through a link that breaks (the job's ranks played by the tests)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
from kubernetes import client

from ddp_client.job import Job
from ddp_operator import constants as c
from kube import Jobs, wait_until
from linkproxy import LinkProxy


@pytest.fixture
def api_link(kube_api: client.ApiClient) -> Iterator[tuple[LinkProxy, client.ApiClient]]:
    """A proxy on loopback in front of the API server, and an API client that goes through it."""
    proxy = LinkProxy(kube_api.configuration.host)
    configuration = copy.copy(kube_api.configuration)
    configuration.host = f"https://127.0.0.1:{proxy.port}"
    through = client.ApiClient(configuration)
    yield proxy, through
    through.close()
    proxy.close()


@pytest.fixture
def waiting(jobs: Jobs, api_link: tuple[LinkProxy, client.ApiClient]) -> Iterator[Callable[..., Future]]:
    """Creates a job and runs wait() on it (through the link) on a thread of its own, returning once
    wait() has seen it Running: news the watch brought (the job was read before it had that phase)."""
    pool = ThreadPoolExecutor(1)

    def start(name: str, world_size: int) -> Future:
        jobs.create(name, worldSize=world_size)
        handle = Job(name, jobs.namespace, api_link[1])
        waited = pool.submit(handle.wait, timeout=60, out=None, poll_s=0.2)
        wait_until(lambda: (handle._seen or {}).get("status", {}).get("phase") == c.PHASE_RUNNING, 30,
                   "wait() to see the job Running")
        return waited

    yield start
    pool.shutdown(wait=False)


def test_wait_rides_out_a_watch_cut_mid_stream(jobs: Jobs, api_link: tuple[LinkProxy, client.ApiClient],
                                               waiting: Callable[..., Future]) -> None:
    proxy, _ = api_link
    waited = waiting("cut", 2)
    assert proxy.cut_open() >= 2, "the watch's connection, both ends, was open to be cut"
    jobs.finish("cut-0", 0)
    jobs.finish("cut-1", 0)
    assert waited.result(timeout=60)["phase"] == c.PHASE_SUCCEEDED  # re-raises what wait() raised


def test_wait_reads_the_job_again_once_the_api_server_answers_after_a_drop(
        jobs: Jobs, api_link: tuple[LinkProxy, client.ApiClient], waiting: Callable[..., Future]) -> None:
    proxy, _ = api_link
    waited = waiting("blip", 1)
    try:
        proxy.refusing = True  # the API server goes away: the watch breaks and reading the job again fails
        proxy.cut_open()
        jobs.finish("blip-0", 0)  # while wait() cannot see it
        wait_until(lambda: proxy.refused >= 3, 30, "wait() to try the API server again, more than once")
        assert not waited.done(), waited.exception()
        proxy.refusing = False
        assert waited.result(timeout=60)["phase"] == c.PHASE_SUCCEEDED
    finally:
        proxy.refusing = False
