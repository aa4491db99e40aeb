"""The kopf handlers stay thin: a job's events feed the store and the status queue, nothing more; a
deleted job is forgotten; with a glob of namespaces only the matching ones are served."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from ddp_operator import handlers
from ddp_operator.reconciler import JobStore
from fakekube import ddpjob


class Recorder:
    def __init__(self) -> None:
        self.added: list[tuple[str, str]] = []
        self.forgotten: list[tuple[str, str]] = []

    def add(self, key: tuple[str, str]) -> None:
        self.added.append(key)

    def forget(self, key: tuple[str, str]) -> None:
        self.forgotten.append(key)


def runtime(namespaces: tuple[str, ...] = ()) -> Any:
    return SimpleNamespace(namespaces=namespaces, jobs=JobStore(), reconciler=Recorder())


def event(memo: Any, kind: str, job: dict[str, Any]) -> None:
    asyncio.run(handlers.job_event(event={"type": kind}, body=job, memo=SimpleNamespace(parts=memo)))  # type: ignore[arg-type]


def test_a_job_s_event_stores_it_and_asks_for_a_status_pass() -> None:
    memo = runtime()
    event(memo, "ADDED", ddpjob())
    assert memo.jobs.get(("team", "mnist"))["metadata"]["uid"] == "job-uid" and memo.reconciler.added == [("team", "mnist")]
    assert handlers.jobs_known(memo=SimpleNamespace(get=lambda _: memo)) == 1


def test_a_deleted_job_is_forgotten() -> None:
    memo = runtime()
    event(memo, "ADDED", ddpjob())
    event(memo, "DELETED", ddpjob())
    assert memo.jobs.get(("team", "mnist")) is None and memo.reconciler.forgotten == [("team", "mnist")]


def test_with_a_glob_jobs_of_other_namespaces_are_ignored() -> None:
    memo = runtime(("t-1-*",))
    event(memo, "ADDED", ddpjob())  # namespace "team"
    served = ddpjob()
    served["metadata"]["namespace"] = "t-1-a"
    event(memo, "ADDED", served)
    assert memo.reconciler.added == [("t-1-a", "mnist")] and len(memo.jobs) == 1


def test_news_of_nodes_concerns_jobs_on_them_and_jobs_waiting_for_one() -> None:
    parts_ = object.__new__(handlers.OperatorParts)
    placed = {("team", "a"): [{"spec": {"nodeName": "gpu-1"}}], ("team", "b"): [{"spec": {"nodeName": "gpu-2"}}],
              ("team", "c"): [{"spec": {}}]}
    parts_.pods = SimpleNamespace(jobs_with=lambda wanted: {k for k, pods in placed.items() if any(map(wanted, pods))})
    changed: list[tuple[str, str]] = []
    parts_._job_changed = changed.append  # type: ignore[method-assign]
    parts_._nodes_changed({"gpu-1"})
    assert sorted(changed) == [("team", "a"), ("team", "c")]
