"""Events on a DDPJob: shaped for `kubectl describe`, posted on the status pool, never failing a pass."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from kubernetes.client.rest import ApiException

from ddp_contract import api
from ddp_operator.events import COMPONENT, MAX_MESSAGE, build_event, post_event
from ddp_operator.reconciler import JobStore
from fakekube import FakeKube, ddpjob

NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


def test_an_event_names_the_job_by_uid_and_keeps_a_long_message_short() -> None:
    event = build_event(ddpjob(), type_="Warning", reason="RankFailed", message="x" * 5000, now=NOW)
    involved = event["involvedObject"]
    assert (involved["kind"], involved["apiVersion"], involved["name"], involved["uid"]) == (api.KIND, api.API_VERSION,
                                                                                             "mnist", "job-uid")
    assert event["metadata"]["name"].startswith("mnist.") and event["metadata"]["namespace"] == "team"
    assert len(event["message"]) == MAX_MESSAGE and event["reportingComponent"] == COMPONENT
    assert event["firstTimestamp"] == event["lastTimestamp"] == "2025-01-02T03:04:05Z" and event["count"] == 1
    assert build_event(ddpjob(), type_="Normal", reason="A", message="", now=NOW)["metadata"]["name"] != event["metadata"]["name"]


def test_posting_goes_through_the_status_pool_and_a_refused_or_broken_post_is_only_logged(caplog) -> None:
    kube = FakeKube(JobStore())
    sent: list[bool] = []

    async def send(fn, *args, status: bool = False, **kwargs) -> None:  # type: ignore[no-untyped-def]
        sent.append(status)
        fn(*args, **kwargs)

    kube.send = send  # type: ignore[method-assign]
    asyncio.run(post_event(kube, ddpjob(), type_="Normal", reason="AllRanksReady", message="2 ranks ready"))  # type: ignore[arg-type]
    assert [e["reason"] for e in kube.events] == ["AllRanksReady"] and sent == [True]

    for failure in (ApiException(status=403, reason="Forbidden"), RuntimeError("connection reset")):
        def refuse(namespace: str, event: dict, failure: Exception = failure) -> None:
            raise failure
        kube.core.create_namespaced_event = refuse
        asyncio.run(post_event(kube, ddpjob(), type_="Warning", reason="RankFailed", message="rank 1 failed"))  # type: ignore[arg-type]
    assert len(kube.events) == 1 and caplog.text.count("could not post event RankFailed on mnist") == 2
