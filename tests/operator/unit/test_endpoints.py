"""The operator's HTTP endpoint: /metrics, /healthz by its checks, 404 elsewhere; on loopback, any free port."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from ddp_operator.endpoints import Endpoint, Health


@pytest.fixture
def served() -> Iterator[tuple[Endpoint, Health]]:
    health = Health()
    endpoint = Endpoint("127.0.0.1", 0, health)
    endpoint.start()
    yield endpoint, health
    endpoint.stop()


def get(endpoint: Endpoint, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{endpoint.port}{path}", timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_metrics_are_served_in_prometheus_text(served) -> None:
    endpoint, _ = served
    status, body = get(endpoint, "/metrics")
    assert status == 200 and "# TYPE ddp_operator_leader gauge" in body


def test_health_follows_its_checks(served) -> None:
    endpoint, health = served
    assert get(endpoint, "/healthz") == (200, "ok\n")
    health.add("event-loop", lambda: False)
    health.add("broken", lambda: 1 / 0)  # type: ignore[func-returns-value]
    health.add("leader-election", lambda: True)
    assert get(endpoint, "/healthz") == (500, "failing: event-loop, broken\n")


def test_other_paths_are_not_found(served) -> None:
    endpoint, _ = served
    assert get(endpoint, "/")[0] == 404
