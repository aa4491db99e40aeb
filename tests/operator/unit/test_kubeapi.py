"""Which API errors mean "the job is going away" (nothing to retry) and which must be retried."""

import json
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from prometheus_client import REGISTRY

from ddp_contract import api
from ddp_operator.kubeapi import api_message, is_going_away, measured


def api_error(status: int, reason: str, message: str, kind: str | None = None) -> ApiException:
    error = ApiException(status=status, reason=reason)
    body = {"kind": "Status", "status": "Failure", "message": message, "reason": reason}
    if kind is not None:
        body["details"] = {"name": "x", "kind": kind}
    error.body = json.dumps(body)
    return error


@pytest.mark.parametrize(
    "error, going",
    [
        (api_error(404, "NotFound", 'ddpjobs.x "j" not found', api.PLURAL), True),
        (api_error(404, "NotFound", 'namespaces "t-1" not found', "namespaces"), True),
        (api_error(403, "Forbidden", "unable to create new content in namespace t-1 because it is being "
                   "terminated", None), False),
        (api_error(404, "NotFound", 'roles.rbac.authorization.k8s.io "j-trainer" not found', "roles"), False),
        (api_error(500, "InternalError", "etcdserver: request timed out"), False),
        (api_error(409, "Conflict", "the object has been modified"), False),
    ],
)
def test_going_away_only_for_the_job_or_its_namespace(error: ApiException, going: bool) -> None:
    assert is_going_away(error) is going


def test_namespace_terminating_cause_counts_as_going_away() -> None:
    error = api_error(403, "Forbidden", "unable to create new content in namespace t-1 because it is being terminated")
    body = json.loads(error.body)
    body["details"] = {"name": "t-1", "kind": "namespaces", "causes": [{"reason": "NamespaceTerminating"}]}
    error.body = json.dumps(body)
    assert is_going_away(error)


def test_api_message_reads_the_status_body_or_falls_back_to_the_reason() -> None:
    assert api_message(api_error(422, "Invalid", "spec.containers[0].image: Required value")) == \
        "spec.containers[0].image: Required value"
    bare = ApiException(status=503, reason="Service Unavailable")
    assert api_message(bare) == "Service Unavailable"


def test_every_request_of_a_measured_client_is_counted_by_verb_resource_and_code() -> None:
    answers: list[Any] = [SimpleNamespace(status=201), ApiException(status=409, reason="AlreadyExists"),
                          ConnectionResetError("reset")]

    def request(method: str, url: str, query_params: Any = None, *args: Any, **kwargs: Any) -> Any:
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    api_client = client.ApiClient()
    api_client.request = request  # type: ignore[method-assign]
    measured(api_client)
    url = "https://127.0.0.1:6443/api/v1/namespaces/unit-test/pods"

    def count(code: str) -> float:
        labels = {"verb": "create", "resource": "pods", "code": code}
        return REGISTRY.get_sample_value("ddp_operator_api_requests_total", labels) or 0.0

    before = {code: count(code) for code in ("201", "409", "0")}
    assert api_client.request("POST", url, None, body={}).status == 201
    with pytest.raises(ApiException):
        api_client.request("POST", url)
    with pytest.raises(ConnectionResetError):
        api_client.request("POST", url)
    assert {code: count(code) - before[code] for code in before} == {"201": 1, "409": 1, "0": 1}


def test_ensure_each_builds_each_object_as_its_call_goes_keeps_the_order_and_the_errors() -> None:
    import asyncio

    from ddp_operator.kubeapi import CONCURRENCY, ensure_each

    built: list[int] = []
    in_flight, most = 0, 0

    async def ensure(obj: dict[str, Any]) -> dict[str, Any] | None:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.001 * (obj["index"] % 3))  # answers come back out of order
        in_flight -= 1
        if obj["index"] == 7:
            raise api_error(403, "Forbidden", "exceeded quota")
        return {"name": "held"} if obj["index"] == 9 else None

    def build(index: int) -> dict[str, Any]:
        built.append(index)
        return {"index": index}

    indices = list(range(10, 10 + 4 * CONCURRENCY))
    results = asyncio.run(ensure_each(ensure, indices, build))
    assert sorted(built) == indices, "each object built once"
    assert most == CONCURRENCY, f"{most} calls in flight at once"
    assert [type(r).__name__ for r in results] == ["NoneType"] * len(indices)
    small = asyncio.run(ensure_each(ensure, [5, 7, 9], build))
    assert small[0] is None and isinstance(small[1], ApiException) and small[2] == {"name": "held"}
