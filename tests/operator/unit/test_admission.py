"""The API server's refusals, as kube-apiserver 1.34 words them, sorted by who refused and whether waiting helps."""

from __future__ import annotations

import pytest

from ddp_operator import constants as c
from ddp_operator.admission import RETRY_MAX, classify, retry_after

POD_SECURITY = ('pods "train-1" is forbidden: violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false '
                '(container "trainer" must set securityContext.allowPrivilegeEscalation=false)')
QUOTA = 'pods "train-2" is forbidden: exceeded quota: team, requested: pods=1, used: pods=1, limited: pods=1'
QUOTA_SPECIFY = 'pods "train-0" is forbidden: failed quota: team: must specify limits.memory for: trainer'
LIMIT_RANGE = ('pods "train-0" is forbidden: [minimum cpu usage per Container is 100m, but request is 10m, maximum memory '
               'usage per Container is 1Gi, but limit is 2Gi]')
POLICY = ('pods "train-0" is forbidden: ValidatingAdmissionPolicy \'no-gpu\' with binding \'no-gpu\' denied request: '
          'GPUs are not allowed here')
WEBHOOK = 'admission webhook "policy.example.com" denied the request: image registry not allowed'
RBAC = ('pods is forbidden: User "system:serviceaccount:ops:ddp-operator" cannot create resource "pods" in API group "" '
        'in the namespace "team-a"')
INVALID = 'Pod "train-0" is invalid: spec.containers[1].name: Duplicate value: "trainer"'


@pytest.mark.parametrize(("status", "message", "reason", "words"), [
    (403, POD_SECURITY, c.REASON_POD_SECURITY, 'violates PodSecurity "restricted:latest": allowPrivilegeEscalation'),
    (403, QUOTA, c.REASON_QUOTA_EXCEEDED, "exceeded quota: team, requested: pods=1, used: pods=1, limited: pods=1"),
    (403, QUOTA_SPECIFY, c.REASON_QUOTA_NEEDS_RESOURCES, "failed quota: team: must specify limits.memory for: trainer"),
    (403, LIMIT_RANGE, c.REASON_LIMIT_RANGE, "minimum cpu usage per Container is 100m, but request is 10m, maximum"),
    (403, POLICY, c.REASON_ADMISSION_DENIED, "ValidatingAdmissionPolicy 'no-gpu' with binding 'no-gpu' denied request"),
    (422, POLICY.replace("forbidden", "invalid"), c.REASON_ADMISSION_DENIED, "denied request: GPUs are not allowed"),
    (400, WEBHOOK, c.REASON_ADMISSION_DENIED, 'admission webhook "policy.example.com" denied the request'),
    (403, RBAC, c.REASON_FORBIDDEN, 'cannot create resource "pods"'),
    (403, 'pods "x-0" is forbidden: pod node label selector conflicts with its namespace node label selector',
     c.REASON_ADMISSION_DENIED, "pod node label selector conflicts"),
    (422, INVALID, c.REASON_INVALID_SPEC, 'spec.containers[1].name: Duplicate value: "trainer"'),
])
def test_each_refusal_is_named_by_who_refused_in_the_server_s_words(status: int, message: str, reason: str,
                                                                    words: str) -> None:
    refusal = classify(status, message)
    assert refusal is not None and refusal.reason == reason and words in refusal.message
    assert refusal.waits == (reason == c.REASON_QUOTA_EXCEEDED)
    assert (reason in c.FAIL_AT_ONCE_REASONS) != refusal.waits


def test_the_object_s_name_is_left_out_so_that_ranks_refused_alike_are_said_together() -> None:
    one, other = classify(403, POD_SECURITY), classify(403, POD_SECURITY.replace("train-1", "train-7"))
    assert one == other and "train-" not in one.message  # type: ignore[union-attr]
    assert one.said_of("pod").startswith("the API server refused the pod: violates PodSecurity")  # type: ignore[union-attr]


def test_a_limit_range_refusal_loses_the_brackets_around_its_list() -> None:
    refusal = classify(403, LIMIT_RANGE)
    assert refusal is not None and refusal.message.startswith("minimum") and refusal.message.endswith("2Gi")


@pytest.mark.parametrize(("status", "message"), [(409, 'pods "x-0" already exists'), (500, "etcdserver: request timed out"),
                                                 (None, "Connection refused"), (404, 'namespaces "gone" not found')])
def test_errors_that_are_no_refusal_are_left_to_the_caller(status: int | None, message: str) -> None:
    assert classify(status, message) is None


def test_retries_after_a_quota_refusal_back_off_to_a_minute() -> None:
    waits = [retry_after(n) for n in range(1, 9)]
    assert waits[:4] == [5, 10, 20, 40] and waits[-1] == RETRY_MAX == 60 and waits == sorted(waits)
