"""Rank pods meet the restricted Pod Security profile unless their template says otherwise."""

from __future__ import annotations

from typing import Any

from ddp_operator.podsecurity import with_restricted_defaults

RESTRICTED_CONTAINER = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def pod(**spec: Any) -> dict[str, Any]:
    return {"containers": [{"name": "trainer", "image": "t"}], **spec}


def test_a_bare_pod_gets_every_field_the_restricted_profile_asks_for() -> None:
    secured = with_restricted_defaults(pod(initContainers=[{"name": "fetch"}]))
    assert secured["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    assert [c["securityContext"] for c in secured["initContainers"] + secured["containers"]] == [RESTRICTED_CONTAINER] * 2


def test_the_template_s_own_values_win_field_by_field() -> None:
    own_seccomp = {"type": "Localhost", "localhostProfile": "p"}
    template = pod(securityContext={"runAsUser": 1234, "fsGroup": 5, "seccompProfile": own_seccomp},
                   containers=[{"name": "trainer", "securityContext": {"capabilities": {"add": ["NET_BIND_SERVICE"]}}},
                               {"name": "sidecar", "securityContext": {"allowPrivilegeEscalation": True}}])
    secured = with_restricted_defaults(template)
    assert secured["securityContext"] == {"runAsUser": 1234, "fsGroup": 5, "runAsNonRoot": True, "seccompProfile": own_seccomp}
    trainer, sidecar = secured["containers"]
    assert trainer["securityContext"] == {"capabilities": {"add": ["NET_BIND_SERVICE"]}, "allowPrivilegeEscalation": False}
    assert sidecar["securityContext"] == {"allowPrivilegeEscalation": True, "capabilities": {"drop": ["ALL"]}}


def test_a_template_that_runs_as_root_is_not_contradicted() -> None:
    as_root = {"runAsUser": 0}
    for template in (pod(securityContext=as_root), pod(containers=[{"name": "trainer", "securityContext": as_root}])):
        assert "runAsNonRoot" not in with_restricted_defaults(template)["securityContext"]
    assert with_restricted_defaults(pod(securityContext={"runAsNonRoot": False}))["securityContext"]["runAsNonRoot"] is False


def test_a_privileged_container_is_not_given_what_the_kubelet_refuses_beside_privileged() -> None:
    secured = with_restricted_defaults(pod(containers=[{"name": "trainer", "securityContext": {"privileged": True}}]))
    assert secured["containers"][0]["securityContext"] == {"privileged": True}


def test_a_container_s_own_seccomp_profile_keeps_the_pod_level_one_unset() -> None:
    template = pod(containers=[{"name": "trainer", "securityContext": {"seccompProfile": {"type": "Unconfined"}}}])
    assert "seccompProfile" not in with_restricted_defaults(template)["securityContext"]


def test_the_template_is_not_changed() -> None:
    template = pod()
    with_restricted_defaults(template)
    assert template == pod()
