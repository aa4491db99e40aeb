"""Leader election on a Lease, against an in-memory Lease API and a clock the tests move."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from ddp_operator.config import LeaseConfig
from ddp_operator.leader import LeaderElector, Observed, next_spec

WALL = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


class Leases:
    """One Lease as the API server keeps it: a resourceVersion per write, 409 on a stale one."""

    def __init__(self) -> None:
        self.stored: dict[str, Any] | None = None
        self.version = 0
        self.down = False
        self.api_client = client.ApiClient()

    def _check(self) -> None:
        if self.down:
            raise ApiException(status=503, reason="Service Unavailable")

    def read_namespaced_lease(self, name: str, namespace: str, _preload_content: bool = True) -> Any:
        assert not _preload_content, "the elector reads the Lease's JSON as written, never the client's model"
        self._check()
        if self.stored is None:
            raise ApiException(status=404, reason="Not Found")
        return SimpleNamespace(data=json.dumps(self.stored).encode())

    def create_namespaced_lease(self, namespace: str, body: dict[str, Any]) -> None:
        self._check()
        if self.stored is not None:
            raise ApiException(status=409, reason="AlreadyExists")
        self._store(body)

    def replace_namespaced_lease(self, name: str, namespace: str, body: dict[str, Any]) -> None:
        self._check()
        if self.stored is None or body["metadata"].get("resourceVersion") != self.stored["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        self._store(body)

    def _store(self, body: dict[str, Any]) -> None:
        self.version += 1
        self.stored = copy.deepcopy(body)
        self.stored["metadata"]["resourceVersion"] = str(self.version)

    @property
    def holder(self) -> str | None:
        return (self.stored or {}).get("spec", {}).get("holderIdentity")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def world() -> tuple[Leases, Clock]:
    return Leases(), Clock()


def elector(world: tuple[Leases, Clock], identity: str, lost: list[str] | None = None) -> LeaderElector:
    leases, clock = world
    config = LeaseConfig("ddp", "ops", identity, duration=15, renew_deadline=10, retry_period=2)
    made = LeaderElector(client.ApiClient(), config, on_lost=lambda: (lost if lost is not None else []).append(identity),
                         clock=clock, wallclock=lambda: WALL)
    made._api = leases  # type: ignore[assignment]
    return made


def test_the_first_takes_a_free_lease_and_the_other_waits(world) -> None:
    leases, _ = world
    a, b = elector(world, "a"), elector(world, "b")
    assert a.step() and a.leading.is_set() and leases.holder == "a"
    assert b.step() and not b.leading.is_set()
    spec = leases.stored["spec"]  # type: ignore[index]
    assert spec["leaseDurationSeconds"] == 15 and spec["leaseTransitions"] == 0
    assert spec["renewTime"] == "2026-11-23T12:00:00.000000Z"


def test_a_standby_takes_over_once_the_lease_went_unrenewed_for_its_duration_as_it_saw_it(world) -> None:
    leases, clock = world
    a, b = elector(world, "a"), elector(world, "b")
    a.step()
    b.step()  # b sees version 1 at t=100
    clock.now += 10
    a.step()  # renewed: a new version
    clock.now += 1
    b.step()  # b sees the renewal at t=111 (not when it was written)
    clock.now += 14.9  # a is gone; 14.9 s since b saw a change
    assert b.step() and not b.leading.is_set() and leases.holder == "a"
    clock.now += 0.2
    b.step()
    assert b.leading.is_set() and leases.holder == "b" and leases.stored["spec"]["leaseTransitions"] == 1  # type: ignore[index]


def test_a_leader_that_cannot_renew_gives_up_within_the_renew_deadline(world) -> None:
    leases, clock = world
    lost: list[str] = []
    a = elector(world, "a", lost)
    a.step()
    leases.down = True
    clock.now += 9
    assert a.step() and a.leading.is_set()
    clock.now += 2  # 11 s without a renewal: past the 10 s deadline, before the 15 s anyone may take over
    assert not a.step()
    assert not a.leading.is_set() and a.lost and lost == ["a"]


def test_a_leader_that_finds_the_lease_taken_stops_at_once(world) -> None:
    leases, clock = world
    lost: list[str] = []
    a, b = elector(world, "a", lost), elector(world, "b", lost)
    a.step()
    b.step()
    clock.now += 16  # a was paused past the duration: b takes over
    b.step()
    assert leases.holder == "b"
    assert not a.step() and lost == ["a"]


def test_of_two_standbys_racing_for_an_expired_lease_one_wins(world) -> None:
    leases, clock = world
    a, b, c = elector(world, "a"), elector(world, "b"), elector(world, "c")
    a.step()
    b.step()
    c.step()
    clock.now += 16
    b._read = c._read = lambda: copy.deepcopy(leases.stored)  # both read the same version
    b.step()
    c.step()
    assert (b.leading.is_set(), c.leading.is_set()) == (True, False) and leases.holder == "b"


def test_a_release_hands_the_lease_to_the_next_try(world) -> None:
    leases, _ = world
    a, b = elector(world, "a"), elector(world, "b")
    a.step()
    b.step()
    a.stop(release=True)
    assert leases.holder is None and not a.leading.is_set()
    b.step()
    assert b.leading.is_set() and leases.holder == "b"


def test_next_spec_keeps_the_acquire_time_of_its_own_lease() -> None:
    lease = LeaseConfig("ddp", "ops", "a")
    own = {"holderIdentity": "a", "acquireTime": "2026-01-01T00:00:00.000000Z", "leaseTransitions": 3}
    spec = next_spec(lease, Observed(own, "7", since=0.0), now=1.0, wall=WALL)
    assert spec is not None and spec["acquireTime"] == own["acquireTime"] and spec["leaseTransitions"] == 3
    held = {**own, "holderIdentity": "b", "leaseDurationSeconds": 15}
    assert next_spec(lease, Observed(held, "7", since=0.0), now=14.0, wall=WALL) is None
    taken = next_spec(lease, Observed(held, "7", since=0.0), now=15.0, wall=WALL)
    assert taken is not None and taken["leaseTransitions"] == 4 and taken["acquireTime"] == taken["renewTime"]
