"""A gang's pods against a namespace's ResourceQuotas, counted as the API server counts them."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from ddp_operator import constants as c
from ddp_operator.quota import container_defaults, covers, gang_shortfall, pod_usage, pods_that_fit, with_defaults


def rank_pod(requests: dict[str, Any] | None = None, limits: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    resources = {k: v for k, v in (("requests", requests), ("limits", limits)) if v}
    return {"spec": {"containers": [{"name": "trainer", "resources": resources}], **spec}}


def quota(hard: dict[str, Any], used: dict[str, Any] | None = None, name: str = "team", **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"hard": hard, **spec},
            "status": {"hard": hard, "used": used or {r: "0" for r in hard}}}


def test_a_gang_that_fits_is_admitted() -> None:
    gang = [rank_pod(limits={"nvidia.com/gpu": 1, "memory": "2Gi"}) for _ in range(2)]
    assert gang_shortfall(gang, [quota({"pods": 4, "requests.nvidia.com/gpu": 2, "requests.memory": "4Gi"})]) is None


def test_one_gpu_left_for_a_gang_of_two_admits_none_of_it() -> None:
    gang = [rank_pod(limits={"nvidia.com/gpu": 1}) for _ in range(2)]
    shortfall = gang_shortfall(gang, [quota({"requests.nvidia.com/gpu": "2"}, {"requests.nvidia.com/gpu": "1"})])
    assert shortfall is not None and shortfall.reason == c.REASON_QUOTA_EXCEEDED
    assert "ResourceQuota team" in shortfall.message and "requests.nvidia.com/gpu=2 with 1 used of 2" in shortfall.message
    assert "the gang's 2 pods" in shortfall.message and "none of its pods is created" in shortfall.message


def test_an_elastic_gang_is_created_as_large_as_the_quotas_hold_down_to_its_minimum() -> None:
    pod = rank_pod(limits={"nvidia.com/gpu": 2})
    quotas = [quota({"requests.nvidia.com/gpu": "16"}, {"requests.nvidia.com/gpu": "3"}), quota({"pods": "100"}, name="b")]
    assert pods_that_fit(pod, quotas, most=8, least=2) == 6  # 13 GPUs left: 6 pods of 2
    assert pods_that_fit(pod, quotas, most=8, least=7) == 0  # fewer than the minimum: none
    assert pods_that_fit(pod, quotas, most=5, least=1) == 5  # all of them
    assert pods_that_fit(pod, quotas, most=8, least=2, leaving=[pod]) == 7  # a leaving pod's 2 GPUs come free
    assert pods_that_fit(pod, [quota({"pods": "1000"}, {"pods": "1"})], most=1000, least=1) == 999
    assert pods_that_fit(rank_pod(), [quota({"requests.cpu": "4"})], most=4, least=1) == 0  # unsaid cpu: no count fits
    shortfall = gang_shortfall([pod] * 8, quotas, created=6)
    assert shortfall is not None and "only 6 of its pods are created (spec.minWorldSize)" in shortfall.message


def test_an_old_attempt_s_pods_still_counted_free_their_share_for_the_new_gang() -> None:
    gang = [rank_pod(limits={"nvidia.com/gpu": 1}) for _ in range(2)]
    full = [quota({"pods": "2", "requests.nvidia.com/gpu": "2"}, {"pods": "2", "requests.nvidia.com/gpu": "2"})]
    assert gang_shortfall(gang, full, leaving=gang) is None  # the old gang's two pods, being deleted
    shortfall = gang_shortfall(gang, full, leaving=gang[:1])  # one pod of someone else's still holds its GPU
    assert shortfall is not None and "requests.nvidia.com/gpu=2 with 2 used of 2" in shortfall.message


def test_pods_count_against_a_pod_quota() -> None:
    shortfall = gang_shortfall([rank_pod(), rank_pod(), rank_pod()], [quota({"pods": "1"})])
    assert shortfall is not None and "pods=3 with 0 used of 1" in shortfall.message


def test_memory_is_said_in_gibibytes_and_cpu_as_cores() -> None:
    gang = [rank_pod(requests={"cpu": "1500m", "memory": "3Gi"}) for _ in range(2)]
    shortfall = gang_shortfall(gang, [quota({"requests.cpu": "2", "requests.memory": "4Gi"})])
    assert shortfall is not None
    assert "requests.cpu=3 with 0 used of 2" in shortfall.message and "requests.memory=6Gi" in shortfall.message


def test_requests_default_to_limits_and_plain_cpu_counts_requests() -> None:
    usage = pod_usage(with_defaults(rank_pod(limits={"cpu": "2", "memory": "1Gi"})["spec"], {}))
    assert usage["requests.cpu"] == usage["cpu"] == Decimal(2) and usage["limits.memory"] == Decimal(2**30)


def test_limit_range_defaults_fill_what_the_container_leaves_unset() -> None:
    limit_range = {"spec": {"limits": [{"type": "Container", "default": {"memory": "1Gi"}, "defaultRequest": {"cpu": "250m"}},
                                       {"type": "Pod", "max": {"cpu": "64"}}]}}
    defaults = container_defaults([limit_range])
    assert defaults == {"limits": {"memory": "1Gi"}, "requests": {"cpu": "250m"}}
    usage = pod_usage(with_defaults(rank_pod(requests={"cpu": "1"})["spec"], defaults))
    assert usage["requests.cpu"] == Decimal(1) and usage["limits.memory"] == usage["requests.memory"] == Decimal(2**30)
    # A quota on memory a container does not set is met by the LimitRange's default.
    assert gang_shortfall([rank_pod()], [quota({"limits.memory": "1Gi"})], limit_ranges=[limit_range]) is None


def test_a_quota_on_what_no_container_sets_needs_resources_in_the_spec() -> None:
    shortfall = gang_shortfall([rank_pod()], [quota({"limits.memory": "8Gi", "requests.cpu": "8"})])
    assert shortfall is not None and shortfall.reason == c.REASON_QUOTA_NEEDS_RESOURCES
    assert "requests.cpu for trainer" in shortfall.message and "limits.memory for trainer" in shortfall.message


def test_init_containers_count_their_largest_and_sidecars_beside_the_containers() -> None:
    spec = rank_pod(requests={"cpu": "1"})["spec"]
    spec["initContainers"] = [{"name": "fetch", "resources": {"requests": {"cpu": "3"}}},
                              {"name": "warm", "resources": {"requests": {"cpu": "2"}}}]
    assert pod_usage(with_defaults(spec, {}))["requests.cpu"] == Decimal(3)
    spec["initContainers"].append({"name": "logs", "restartPolicy": "Always", "resources": {"requests": {"cpu": "2.5"}}})
    assert pod_usage(with_defaults(spec, {}))["requests.cpu"] == Decimal("3.5")


def test_quota_scopes_select_the_pods_they_count() -> None:
    best_effort, sized = rank_pod()["spec"], rank_pod(requests={"cpu": "1"})["spec"]
    assert covers(quota({}, scopes=["BestEffort"]), best_effort) and not covers(quota({}, scopes=["BestEffort"]), sized)
    assert covers(quota({}, scopes=["NotTerminating", "NotBestEffort"]), sized)
    assert not covers(quota({}, scopes=["Terminating"]), sized)
    assert covers(quota({}, scopes=["Terminating"]), {**sized, "activeDeadlineSeconds": 60})
    high = quota({}, scopeSelector={"matchExpressions": [{"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]})
    assert covers(high, {**sized, "priorityClassName": "high"}) and not covers(high, sized)
    unset = quota({}, scopeSelector={"matchExpressions": [{"scopeName": "PriorityClass", "operator": "DoesNotExist"}]})
    assert covers(unset, sized)
    # A gang the scoped quota does not count is not refused by it.
    assert gang_shortfall([rank_pod(requests={"cpu": "1"})], [quota({"pods": "0"}, scopes=["BestEffort"])]) is None


def test_a_quota_the_controller_has_not_counted_yet_is_left_to_the_api_server() -> None:
    uncounted = {"metadata": {"name": "new"}, "spec": {"hard": {"pods": "0"}}}
    assert gang_shortfall([rank_pod()], [uncounted]) is None


def test_every_quota_is_judged_and_the_first_refusing_one_by_name_is_said() -> None:
    quotas = [quota({"pods": "0"}, name="zeta"), quota({"pods": "10"}, name="alpha"), quota({"pods": "1"}, name="beta")]
    shortfall = gang_shortfall([rank_pod(), rank_pod()], quotas)
    assert shortfall is not None and shortfall.message.startswith("ResourceQuota beta")
