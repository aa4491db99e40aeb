"""The operator's settings from its environment."""

from __future__ import annotations

import pytest

from ddp_operator.config import (
    ENV_IDENTITY,
    ENV_LEASE_DURATION,
    ENV_LEASE_NAME,
    ENV_LEASE_NAMESPACE,
    ENV_LEASE_RENEW_DEADLINE,
    ENV_LEASE_RETRY_PERIOD,
    ENV_LIVENESS,
    ENV_METRICS_ADDRESS,
    ENV_METRICS_PORT,
    ENV_NAMESPACES,
    ENV_VERBOSE,
    ConfigError,
    LeaseConfig,
    OperatorConfig,
    exact,
    from_env,
    kopf_scope,
    served,
)


def test_nothing_set_means_every_namespace_no_election_and_metrics_on_loopback() -> None:
    config = from_env({}, own_namespace=None, identity="me")
    assert config == OperatorConfig(metrics_address="127.0.0.1", metrics_port=8080)


def test_every_setting_is_read() -> None:
    env = {ENV_METRICS_ADDRESS: "0.0.0.0", ENV_METRICS_PORT: "0", ENV_NAMESPACES: " team-a, team-b ,team-a,",
           ENV_LEASE_NAME: "ddp", ENV_LEASE_DURATION: "6", ENV_LEASE_RENEW_DEADLINE: "4",
           ENV_LEASE_RETRY_PERIOD: "0.5", ENV_IDENTITY: "pod-1", ENV_VERBOSE: "1",
           ENV_LIVENESS: "http://0.0.0.0:8081/healthz"}
    config = from_env(env, own_namespace="ops")
    assert config == OperatorConfig("0.0.0.0", 0, ("team-a", "team-b"), LeaseConfig("ddp", "ops", "pod-1", 6, 4, 0.5),
                                    True, "http://0.0.0.0:8081/healthz")


def test_the_lease_namespace_defaults_to_the_pods_and_is_needed_outside_one() -> None:
    assert from_env({ENV_LEASE_NAME: "ddp"}, own_namespace="ops", identity="me").lease == LeaseConfig("ddp", "ops", "me")
    with pytest.raises(ConfigError, match=ENV_LEASE_NAMESPACE):
        from_env({ENV_LEASE_NAME: "ddp"}, own_namespace=None)


@pytest.mark.parametrize("env, named", [
    ({ENV_METRICS_PORT: "http"}, ENV_METRICS_PORT),
    ({ENV_METRICS_PORT: "70000"}, ENV_METRICS_PORT),
    ({ENV_NAMESPACES: "team-a,!team-b"}, ENV_NAMESPACES),
    ({ENV_LEASE_NAME: "ddp", ENV_LEASE_NAMESPACE: "ops", ENV_LEASE_RENEW_DEADLINE: "20"}, ENV_LEASE_RENEW_DEADLINE),
    ({ENV_LEASE_NAME: "ddp", ENV_LEASE_NAMESPACE: "ops", ENV_LEASE_DURATION: "-1"}, ENV_LEASE_DURATION),
])
def test_a_bad_setting_is_refused_naming_it(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        from_env(env, own_namespace=None, identity="me")


def test_globs_are_told_from_exact_names() -> None:
    assert exact(("team-a", "team-b")) and exact(())
    assert not exact(("team-a", "t-1234-*")) and not exact(("team-?",))


def test_a_glob_has_kopf_watch_the_whole_cluster_and_the_operator_pick_the_namespaces() -> None:
    assert kopf_scope(()) == {"clusterwide": True}
    assert kopf_scope(("team-a", "team-b")) == {"namespaces": ["team-a", "team-b"]}
    assert kopf_scope(("team-a", "t-*")) == {"clusterwide": True}  # never kopf's namespace scanning
    assert served("anything", ())
    assert served("team-a", ("team-a", "t-*")) and served("t-1", ("team-a", "t-*"))
    assert not served("team-ab", ("team-a", "t-*")) and not served("x-t-1", ("team-a", "t-*"))
    assert served("t-abc", ("t-ab?",)) and not served("t-abcd", ("t-ab?",))


@pytest.mark.parametrize("value, verbose", [("1", True), ("true", True), ("yes", True), ("", False), ("0", False),
                                            ("false", False), ("False", False), ("no", False), ("off", False)])
def test_verbose_is_off_when_the_variable_says_so(value: str, verbose: bool) -> None:
    assert from_env({ENV_VERBOSE: value}).verbose is verbose
