"""Leader election on a coordination.k8s.io Lease, as client-go's leaderelection does it.

Every replica tries, each retry period, to take or renew the Lease. A Lease held by another is taken
only once it has gone unchanged for its leaseDurationSeconds, timed on this process's own clock from
when this process first saw that version (so clocks need not agree). Writes carry the resourceVersion
read, so of two replicas racing for an expired Lease one wins and the other gets 409. A leader that
cannot renew for renew_deadline (shorter than the duration) stops acting before anyone may take over;
one that stops on purpose releases the Lease (holder cleared), so a standby takes it at its next try.

The loop runs on a thread of its own with its own connections: renewals never wait behind the
operator's pod creations or a busy event loop.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from ddp_contract.timestamps import rfc3339
from ddp_operator import metrics
from ddp_operator.config import LeaseConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Observed:
    """The Lease's spec as last read, and when (monotonic seconds) this process first saw that version."""

    spec: Mapping[str, Any] | None
    version: str | None
    since: float


def next_spec(lease: LeaseConfig, seen: Observed | None, now: float, wall: datetime) -> dict[str, Any] | None:
    """The Lease spec to write in order to lead (take or renew it), or None while another holds it."""
    spec = (seen.spec if seen else None) or {}
    holder = spec.get("holderIdentity")
    ours = holder == lease.identity
    if holder and not ours and seen is not None:
        duration = float(spec.get("leaseDurationSeconds") or lease.duration)
        if now < seen.since + duration:
            return None  # held, and renewed within its duration as far as we can tell
    stamp = rfc3339(wall, millis=True).replace("Z", "000Z")  # MicroTime: microseconds
    transitions = int(spec.get("leaseTransitions") or 0)
    return {
        "holderIdentity": lease.identity,
        "leaseDurationSeconds": max(1, round(lease.duration)),
        "acquireTime": spec.get("acquireTime") if ours else stamp,
        "renewTime": stamp,
        "leaseTransitions": transitions if ours or not spec else transitions + 1,
    }


class LeaderElector:
    """Runs the election loop on a thread; `leading` is set while this process holds the Lease.

    on_lost is called (on the loop's thread) when a leader fails to renew for renew_deadline; the
    loop ends then, and the process is expected to stop acting and exit.
    """

    def __init__(self, api: client.ApiClient, lease: LeaseConfig, *, on_lost: Callable[[], None],
                 clock: Callable[[], float] = time.monotonic, wallclock: Callable[[], datetime] = lambda: datetime.now(UTC)
                 ) -> None:
        self.lease = lease
        self.leading = threading.Event()
        self.lost = False
        self._api = client.CoordinationV1Api(api)
        self._on_lost = on_lost
        self._clock = clock
        self._wallclock = wallclock
        self._seen: Observed | None = None
        self._renewed = float("-inf")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # one write at a time: a release must not race a renewal

    def start(self) -> None:
        metrics.LEADER.set(0)
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, release: bool = True) -> None:
        """Ends the loop; release: hand the Lease over at once if this process holds it."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self.lease.retry_period + 5)
        if release and self.leading.is_set():
            self._release()

    def _run(self) -> None:
        log.info("leader election: %s tries for lease %s/%s", self.lease.identity, self.lease.namespace, self.lease.name)
        while not self._stop.is_set() and self.step():
            self._stop.wait(self.lease.retry_period)

    def step(self) -> bool:
        """One round: try, then lead, or give up leading past the renew deadline; False once lost."""
        if self.try_once():
            self._renewed = self._clock()
            if not self.leading.is_set():
                log.info("leader election: %s leads (lease %s/%s)", self.lease.identity, self.lease.namespace,
                         self.lease.name)
                metrics.LEADER.set(1)
                self.leading.set()
        elif self.leading.is_set() and self._clock() - self._renewed > self.lease.renew_deadline:
            log.error("leader election: %s could not renew lease %s/%s for %.0fs; stopping", self.lease.identity,
                      self.lease.namespace, self.lease.name, self.lease.renew_deadline)
            self._lose()
        return not self.lost

    def _lose(self) -> None:
        self.leading.clear()
        self.lost = True
        metrics.LEADER.set(0)
        self._on_lost()

    def try_once(self) -> bool:
        """One try to take or renew the Lease; True when this process holds it now."""
        with self._lock:
            if self._stop.is_set() and not self.leading.is_set():
                return False
            try:
                return self._try()
            except ApiException as error:
                if error.status != 409:  # 409: another replica wrote first
                    log.warning("leader election: lease %s/%s: %s %s", self.lease.namespace, self.lease.name,
                                error.status, error.reason)
                return False
            except Exception as error:  # noqa: BLE001 - an unreachable API is a failed try, retried
                log.warning("leader election: lease %s/%s: %s", self.lease.namespace, self.lease.name, error)
                return False

    def _try(self) -> bool:
        now = self._clock()
        current = self._read()
        version = current["metadata"]["resourceVersion"] if current else None
        if self._seen is None or self._seen.version != version:
            self._seen = Observed((current or {}).get("spec"), version, now)
        spec = next_spec(self.lease, self._seen if current else None, now, self._wallclock())
        if spec is None:
            if self.leading.is_set():  # another took it (we were paused past the duration): not ours now
                log.error("leader election: lease %s/%s is held by %s", self.lease.namespace, self.lease.name,
                          self._seen.spec and self._seen.spec.get("holderIdentity"))
                self._lose()
            return False
        body = {"metadata": {"name": self.lease.name, "namespace": self.lease.namespace}, "spec": spec}
        if current is None:
            self._api.create_namespaced_lease(self.lease.namespace, body)
        else:
            body["metadata"]["resourceVersion"] = version
            self._api.replace_namespaced_lease(self.lease.name, self.lease.namespace, body)
        return True

    def _read(self) -> dict[str, Any] | None:
        """The Lease as the API server wrote it: its times are written back unchanged, never re-formatted
        (the client's datetimes print without a fraction when it is zero, which a MicroTime refuses)."""
        try:
            response = self._api.read_namespaced_lease(self.lease.name, self.lease.namespace,
                                                       _preload_content=False)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        lease: dict[str, Any] = json.loads(response.data)
        return lease

    def _release(self) -> None:
        """Clears the holder (as client-go does on a graceful stop), so a standby takes over at its next try."""
        with self._lock:
            try:
                current = self._read()
                if current is None or (current.get("spec") or {}).get("holderIdentity") != self.lease.identity:
                    return
                current["spec"] = {**current["spec"], "holderIdentity": None, "leaseDurationSeconds": 1}
                self._api.replace_namespaced_lease(self.lease.name, self.lease.namespace, current)
                log.info("leader election: %s released lease %s/%s", self.lease.identity, self.lease.namespace,
                         self.lease.name)
            except Exception as error:  # noqa: BLE001 - the lease expires by itself
                log.warning("leader election: releasing lease %s/%s failed: %s", self.lease.namespace, self.lease.name,
                            error)
            finally:
                self.leading.clear()
                metrics.LEADER.set(0)
