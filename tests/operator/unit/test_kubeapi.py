"""Which API errors mean "the job is going away" (nothing to retry) and which must be retried."""

import json

import pytest
from kubernetes.client.rest import ApiException

from ddp_contract import api
from ddp_operator.kubeapi import api_message, is_going_away


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
