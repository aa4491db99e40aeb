"""The operator process's settings: their environment variables and defaults, read once at its start."""

from __future__ import annotations

import fnmatch
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from ddp_contract.envnumbers import EnvNumberError, N, env_number

# --- the settings' environment variables and defaults ---------------------------------------------------------------
ENV_VERBOSE: Final = "DDP_OPERATOR_VERBOSE"  # log every decision at debug level; empty, 0, false, no, off: not
ENV_LIVENESS: Final = "DDP_OPERATOR_LIVENESS"  # kopf's own liveness endpoint, e.g. http://0.0.0.0:8081/healthz
ENV_METRICS_ADDRESS: Final = "DDP_OPERATOR_METRICS_ADDRESS"  # where /metrics and /healthz listen
ENV_METRICS_PORT: Final = "DDP_OPERATOR_METRICS_PORT"  # 0: any free port (the log says which)
ENV_NAMESPACES: Final = "DDP_OPERATOR_NAMESPACES"  # comma-separated; empty: the whole cluster
ENV_LEASE_NAME: Final = "DDP_OPERATOR_LEASE_NAME"  # a coordination.k8s.io Lease; empty: no leader election
ENV_LEASE_NAMESPACE: Final = "DDP_OPERATOR_LEASE_NAMESPACE"
ENV_LEASE_DURATION: Final = "DDP_OPERATOR_LEASE_DURATION"  # seconds a standby waits after the last renewal it saw
ENV_LEASE_RENEW_DEADLINE: Final = "DDP_OPERATOR_LEASE_RENEW_DEADLINE"  # a leader unable to renew this long stops
ENV_LEASE_RETRY_PERIOD: Final = "DDP_OPERATOR_LEASE_RETRY_PERIOD"  # seconds between tries (renewals, takeovers)
ENV_IDENTITY: Final = "DDP_OPERATOR_IDENTITY"  # the lease holder's name (the chart: the pod's); else host-pid
DEFAULT_METRICS_ADDRESS: Final = "127.0.0.1"
DEFAULT_METRICS_PORT: Final = 8080
# client-go's defaults for controllers' leader election.
DEFAULT_LEASE_DURATION: Final = 15.0
DEFAULT_LEASE_RENEW_DEADLINE: Final = 10.0
DEFAULT_LEASE_RETRY_PERIOD: Final = 2.0

# Where a pod finds its own namespace (the lease's default namespace in a cluster).
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
GLOB_CHARS = frozenset("*?")
REFUSED_CHARS = frozenset("!,[]")  # kopf's exclusions and lists, fnmatch's sets: not supported
FALSE_WORDS = frozenset({"", "0", "false", "no", "off"})


class ConfigError(ValueError):
    """A setting that cannot be used; the message names the variable."""


@dataclass(frozen=True)
class LeaseConfig:
    name: str
    namespace: str
    identity: str
    duration: float = DEFAULT_LEASE_DURATION
    renew_deadline: float = DEFAULT_LEASE_RENEW_DEADLINE
    retry_period: float = DEFAULT_LEASE_RETRY_PERIOD


@dataclass(frozen=True)
class OperatorConfig:
    metrics_address: str = DEFAULT_METRICS_ADDRESS
    metrics_port: int = DEFAULT_METRICS_PORT
    namespaces: tuple[str, ...] = ()  # empty: every namespace
    lease: LeaseConfig | None = None  # None: no election, this process acts at once
    verbose: bool = False
    liveness: str | None = None


def from_env(env: Mapping[str, str], own_namespace: str | None = None, identity: str | None = None) -> OperatorConfig:
    """own_namespace: the pod's (the lease's default); identity: the default holder name."""
    return OperatorConfig(
        metrics_address=env.get(ENV_METRICS_ADDRESS) or DEFAULT_METRICS_ADDRESS,
        metrics_port=_number(env, ENV_METRICS_PORT, default=DEFAULT_METRICS_PORT, kind=int, upper=65535),
        namespaces=namespaces(env.get(ENV_NAMESPACES, "")),
        lease=_lease(env, own_namespace, identity),
        verbose=_flag(env.get(ENV_VERBOSE)),
        liveness=env.get(ENV_LIVENESS) or None,
    )


def _flag(value: str | None) -> bool:
    """On for any value but empty, 0, false, no and off (so `DDP_OPERATOR_VERBOSE=false` means off)."""
    return (value or "").strip().lower() not in FALSE_WORDS


def namespaces(value: str) -> tuple[str, ...]:
    """Namespace names, or globs (`*`, `?`): exact names are watched each apart; with a glob, jobs and pods are
    watched cluster-wide and those of namespaces that match are served (see kopf_scope)."""
    names = tuple(dict.fromkeys(name.strip() for name in value.split(",") if name.strip()))
    refused = [name for name in names if REFUSED_CHARS & set(name)]
    if refused:
        raise ConfigError(f"{ENV_NAMESPACES}: names or globs with * and ? only: {', '.join(refused)}")
    return names


def exact(names: tuple[str, ...]) -> bool:
    """Whether every namespace is named exactly (no glob)."""
    return not any(GLOB_CHARS & set(name) for name in names)


def served(namespace: str, namespaces: tuple[str, ...]) -> bool:
    """Whether a job in this namespace is the operator's (namespaces empty: every one is)."""
    return not namespaces or any(fnmatch.fnmatchcase(namespace, pattern) for pattern in namespaces)


def kopf_scope(namespaces: tuple[str, ...]) -> dict[str, Any]:
    """kopf.run's scope: exact names each watched apart (a Role in each is enough), else the whole cluster.

    Never kopf's own globs: it lists the namespaces, then watches them from a second listing whose
    entries it ignores, so a namespace created between the two (as one is, next to a starting
    operator) had its jobs ignored until the namespace changed again. With a glob, job_event filters."""
    return {"namespaces": list(namespaces)} if namespaces and exact(namespaces) else {"clusterwide": True}


def _lease(env: Mapping[str, str], own_namespace: str | None, identity: str | None) -> LeaseConfig | None:
    name = env.get(ENV_LEASE_NAME)
    if not name:
        return None
    namespace = env.get(ENV_LEASE_NAMESPACE) or own_namespace
    if not namespace:
        raise ConfigError(f"{ENV_LEASE_NAMESPACE} is needed outside a pod (the lease's namespace)")
    lease = LeaseConfig(
        name=name, namespace=namespace, identity=env.get(ENV_IDENTITY) or identity or default_identity(),
        duration=_number(env, ENV_LEASE_DURATION, default=DEFAULT_LEASE_DURATION, kind=float),
        renew_deadline=_number(env, ENV_LEASE_RENEW_DEADLINE, default=DEFAULT_LEASE_RENEW_DEADLINE, kind=float),
        retry_period=_number(env, ENV_LEASE_RETRY_PERIOD, default=DEFAULT_LEASE_RETRY_PERIOD, kind=float),
    )
    # As client-go requires: a leader gives up before a standby may take over, and tries more than once.
    if not lease.retry_period < lease.renew_deadline < lease.duration:
        raise ConfigError(f"{ENV_LEASE_RETRY_PERIOD} < {ENV_LEASE_RENEW_DEADLINE} < {ENV_LEASE_DURATION} "
                          f"does not hold: {lease.retry_period} < {lease.renew_deadline} < {lease.duration}")
    return lease


def _number(env: Mapping[str, str], name: str, *, default: N, kind: type[N], upper: float | None = None) -> N:
    try:
        return env_number(name, env.get(name), kind, default, maximum=upper)
    except EnvNumberError as error:
        raise ConfigError(str(error)) from None


def default_identity() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def own_namespace() -> str | None:
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE) as f:
            return f.read().strip() or None
    except OSError:
        return None
