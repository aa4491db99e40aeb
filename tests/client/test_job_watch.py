"""Job.wait() against the local control plane, through a link that breaks (the API server's ranks played by kwok)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

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


def test_wait_rides_out_a_watch_cut_mid_stream(jobs: Jobs, api_link: tuple[LinkProxy, client.ApiClient]) -> None:
    proxy, through = api_link
    jobs.create("cut", worldSize=2)
    handle = Job("cut", jobs.namespace, through)
    pool = ThreadPoolExecutor(1)
    waited = pool.submit(handle.wait, timeout=60, out=None, poll_s=0.2)
    # Running is news the watch brought (the job was read before the operator gave it a phase, or at Pending).
    wait_until(lambda: (handle._seen or {}).get("status", {}).get("phase") == c.PHASE_RUNNING, 30,
               "wait() to see the job Running")
    assert proxy.cut_open() >= 2, "the watch's connection, both ends, was open to be cut"
    jobs.finish("cut-0", 0)
    jobs.finish("cut-1", 0)
    try:
        assert waited.result(timeout=60)["phase"] == c.PHASE_SUCCEEDED  # re-raises what wait() raised
    finally:
        pool.shutdown(wait=False)


def test_wait_reads_the_job_again_once_the_api_server_answers_after_a_drop(
        jobs: Jobs, api_link: tuple[LinkProxy, client.ApiClient]) -> None:
    proxy, through = api_link
    jobs.create("blip", worldSize=1)
    handle = Job("blip", jobs.namespace, through)
    pool = ThreadPoolExecutor(1)
    waited = pool.submit(handle.wait, timeout=60, out=None, poll_s=0.2)
    try:
        wait_until(lambda: (handle._seen or {}).get("status", {}).get("phase") == c.PHASE_RUNNING, 30,
                   "wait() to see the job Running")
        proxy.refusing = True  # the API server goes away: the watch breaks and reading the job again fails
        proxy.cut_open()
        jobs.finish("blip-0", 0)  # while wait() cannot see it
        wait_until(lambda: proxy.refused >= 3, 30, "wait() to try the API server again, more than once")
        assert not waited.done(), waited.exception()
        proxy.refusing = False
        assert waited.result(timeout=60)["phase"] == c.PHASE_SUCCEEDED
    finally:
        proxy.refusing = False
        pool.shutdown(wait=False)
