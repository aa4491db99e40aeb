"""spec.dataWorkers: their pods, the ranks' env, what their pods say, and the status that says it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from ddp_contract import api, envnames, labels
from ddp_operator import constants as c
from ddp_operator.conditions import get_condition
from ddp_operator.dataworkers import (
    creates_data_workers,
    data_worker_events,
    data_worker_status,
    is_data_worker,
    keeps_data_workers,
    summarize_data_workers,
)
from ddp_operator.manifests import build_data_worker_pod, build_pod, build_token_secret
from ddp_operator.podsecurity import with_restricted_defaults
from ddp_operator.spec import InvalidSpec, parse_spec, validate_job_name
from kube import env_of

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
CODE_TEMPLATE = {"spec": {
    "nodeSelector": {"pool": "gpu"}, "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
    "volumes": [{"name": "code", "configMap": {"name": "fashion-code"}}],
    "containers": [{"name": "trainer", "volumeMounts": [{"name": "code", "mountPath": "/code"}],
                    "env": [{"name": "FROM_TEMPLATE", "value": "1"}]},
                   {"name": "sidecar", "image": "busybox"}],
}}


def make_job(workers: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    body = {"worldSize": 2, "image": "trainer:1", "entrypoint": "train:main", "template": CODE_TEMPLATE,
            "env": [{"name": "EPOCHS", "value": "3"}],
            "s3": {"endpoint": "http://s3:9000", "credentialsSecret": "s3-creds", "dataset": "s3://data/x"},
            "dataWorkers": {"replicas": 2, "resources": {"limits": {"cpu": "2", "memory": "4Gi"}},
                            "template": {"metadata": {"labels": {"pool": "cpu"}},
                                         "spec": {"nodeSelector": {"pool": "cpu"}}}} if workers is None else workers,
            **spec}
    return {"apiVersion": api.API_VERSION, "kind": api.KIND,
            "metadata": {"name": "fashion", "namespace": "team-a", "uid": "u-1"}, "spec": body}


def data_pod(job: dict[str, Any], index: int, phase: str = "Running", ready: bool = True,
             container: dict[str, Any] | None = None, **status: Any) -> dict[str, Any]:
    pod = build_data_worker_pod(job, parse_spec(job["spec"]), index)
    pod["metadata"]["uid"] = f"uid-{index}"
    pod["status"] = {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                     "containerStatuses": [{"name": labels.DATA_WORKER_CONTAINER_NAME, **(container or {})}], **status}
    return pod


def test_a_data_worker_runs_the_jobs_image_code_and_settings_with_its_own_resources_and_placement() -> None:
    job = make_job()
    pod = build_data_worker_pod(job, parse_spec(job["spec"]), 1)
    spec = pod["spec"]
    (container,) = spec["containers"]  # no sidecar: it serves data, nothing else
    env = env_of(container)
    assert pod["metadata"]["name"] == spec["hostname"] == "fashion-data-1" and spec["subdomain"] == "fashion"
    assert pod["metadata"]["labels"][labels.LABEL_JOB_NAME] == "fashion"  # the job's Service selects it
    assert pod["metadata"]["labels"][labels.LABEL_DATA_WORKER] == "1" and labels.LABEL_RANK not in pod["metadata"]["labels"]
    assert pod["metadata"]["labels"]["pool"] == "cpu"
    assert container["image"] == "trainer:1" and container["command"] == ["python", "-m", "ddp_trainer", "data-worker"]
    assert container["resources"] == {"limits": {"cpu": "2", "memory": "4Gi"}}
    assert container["volumeMounts"] == [{"name": "code", "mountPath": "/code"}] and spec["volumes"][0]["name"] == "code"
    assert env["EPOCHS"] == "3" and env["FROM_TEMPLATE"] == "1" and env[envnames.DATASET_URI] == "s3://data/x"
    assert env[envnames.AWS_ACCESS_KEY_ID] == {"secretKeyRef": {"name": "s3-creds", "key": "AWS_ACCESS_KEY_ID"}}
    assert env[envnames.DATA_WORKER_TOKEN] == {"secretKeyRef": {"name": "fashion-data-token", "key": "token"}}
    assert env[envnames.POD_IP] == "status.podIP"
    assert envnames.RANK not in env and envnames.MASTER_ADDR not in env
    # The ranks' GPU placement is theirs; the data workers' comes from dataWorkers.template.
    assert spec["nodeSelector"] == {"pool": "cpu"} and "tolerations" not in spec
    assert spec["restartPolicy"] == "Always" and spec["automountServiceAccountToken"] is False
    assert spec == with_restricted_defaults(spec)  # restricted Pod Security, as the ranks


def test_the_ranks_are_pointed_at_every_data_worker_with_the_token_from_the_secret() -> None:
    job = make_job()
    env = env_of(next(x for x in build_pod(job, parse_spec(job["spec"]), 0, 0)["spec"]["containers"]
                      if x["name"] == labels.CONTAINER_NAME))
    assert env[envnames.DATA_WORKERS] == ("fashion-data-0.fashion.team-a.svc:29600,"
                                          "fashion-data-1.fashion.team-a.svc:29600")
    assert env[envnames.DATA_WORKER_TOKEN] == {"secretKeyRef": {"name": "fashion-data-token", "key": "token"}}
    secret = build_token_secret(job, "abc")
    assert secret["metadata"]["name"] == "fashion-data-token" and secret["stringData"] == {"token": "abc"}


@pytest.mark.parametrize("workers", [None, {"replicas": 0}])
def test_without_data_workers_the_ranks_get_no_data_env(workers: dict[str, Any] | None) -> None:
    job = make_job(workers={})
    job["spec"].pop("dataWorkers")
    if workers is not None:
        job["spec"]["dataWorkers"] = workers
    env = env_of(build_pod(job, parse_spec(job["spec"]), 0, 0)["spec"]["containers"][0])
    assert envnames.DATA_WORKERS not in env and envnames.DATA_WORKER_TOKEN not in env


def test_the_ranks_of_an_in_place_job_get_the_jobs_token_and_their_pods_address_for_memory_snapshots() -> None:
    job = make_job(workers={})
    job["spec"].pop("dataWorkers")
    assert envnames.JOB_TOKEN not in env_of(build_pod(job, parse_spec(job["spec"]), 0, 0)["spec"]["containers"][0])
    job["spec"]["restartStrategy"] = "InPlace"
    env = env_of(build_pod(job, parse_spec(job["spec"]), 0, 0)["spec"]["containers"][0])
    assert envnames.DATA_WORKER_TOKEN not in env
    assert env[envnames.JOB_TOKEN] == {"secretKeyRef": {"name": "fashion-data-token", "key": "token"}}
    assert env[envnames.POD_IP] == "status.podIP"


@pytest.mark.parametrize(("workers", "field"), [
    ({"replicas": -1}, "spec.dataWorkers.replicas"),
    ({"replicas": 257}, "spec.dataWorkers.replicas"),
    ({"resources": {"limits": {"nvidia.com/gpu": 1}}}, "spec.dataWorkers.resources.limits"),
    ({"template": {"spec": {"containers": []}}}, "spec.dataWorkers.template.spec.containers"),
    ({"template": {"spec": {"restartPolicy": "Never"}}}, "spec.dataWorkers.template.spec.restartPolicy"),
    ({"template": {"metadata": {"labels": {labels.LABEL_JOB_NAME: "x"}}}}, "spec.dataWorkers.template.metadata.labels"),
    ("two", "spec.dataWorkers"),
])
def test_a_bad_data_worker_spec_names_its_field(workers: Any, field: str) -> None:
    with pytest.raises(InvalidSpec) as raised:
        parse_spec(make_job(workers=workers)["spec"])
    assert str(raised.value).startswith(f"{field}:"), raised.value


def test_the_operator_sets_the_data_env_so_spec_env_may_not() -> None:
    job = make_job(env=[{"name": envnames.DATA_WORKERS, "value": "elsewhere:1"}])
    with pytest.raises(InvalidSpec, match=r"spec.env\[0\].name: DDP_DATA_WORKERS is set from spec.dataWorkers"):
        parse_spec(job["spec"])
    job["spec"].pop("dataWorkers")
    assert parse_spec(job["spec"]).env[0]["value"] == "elsewhere:1"  # without them it is the user's


def test_a_data_workers_hostname_must_fit_a_dns_label() -> None:
    validate_job_name("j" * 56, 2, 10)  # j...-data-9: 63 characters
    with pytest.raises(InvalidSpec, match="data-10"):
        validate_job_name("j" * 56, 2, 11)


def test_the_summary_says_which_are_ready_missing_held_up_and_to_make_again() -> None:
    job = make_job(workers={"replicas": 4})
    pods = [
        data_pod(job, 0),
        data_pod(job, 1, ready=False, container={"restartCount": 2, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                                                 "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}),
        data_pod(job, 2, phase="Failed", ready=False, reason="Evicted", message="The node was low on memory."),
    ]
    extra = make_job(workers={"replicas": 6})
    pods.append(data_pod(extra, 5))  # from before replicas went down to 4
    summary = summarize_data_workers(pods, 4)
    assert (summary.ready, summary.desired, summary.missing) == (1, 4, (3,))
    assert summary.remove == ("fashion-data-2", "fashion-data-5")
    assert [(p.index, p.reason) for p in summary.problems] == [(1, "OOMKilled"), (2, "Evicted")]
    assert "restarted 2 times, last exit 137 (OOMKilled)" in summary.problems[0].message
    assert "dataWorkers.resources.limits.memory" in summary.problems[0].message


def test_a_pending_data_worker_says_what_the_scheduler_said() -> None:
    job = make_job()
    pod = data_pod(job, 0, phase="Pending", ready=False, conditions=[
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes: pool=cpu"}])
    (problem,) = summarize_data_workers([pod, data_pod(job, 1)], 2).problems
    assert (problem.reason, problem.message) == (c.REASON_UNSCHEDULABLE, "0/3 nodes: pool=cpu")


def test_a_pod_being_deleted_holds_its_name_but_is_neither_ready_nor_removed_again() -> None:
    job = make_job()
    going = data_pod(job, 0)
    going["metadata"]["deletionTimestamp"] = "2026-11-24T12:00:00Z"
    summary = summarize_data_workers([going], 2)
    assert (summary.ready, summary.missing, summary.remove) == (0, (1,), ())
    assert is_data_worker(going) and not is_data_worker({"metadata": {"labels": {labels.LABEL_RANK: "0"}}})


def test_status_says_ready_of_desired_and_why_short_in_a_condition() -> None:
    job = make_job()
    short = summarize_data_workers([data_pod(job, 0), data_pod(job, 1, phase="Pending", ready=False, conditions=[
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no cpu"}])], 2)
    patch = data_worker_status("fashion", short, phase=c.PHASE_RUNNING, kept=True, refused=None, conditions=[],
                               now=NOW, generation=3)
    assert patch["dataWorkers"]["summary"] == "1/2" and patch["dataWorkers"]["problems"] == [
        {"pod": "fashion-data-1", "reason": c.REASON_UNSCHEDULABLE, "message": "no cpu"}]
    cond = get_condition(patch["conditions"], c.COND_DATA_WORKERS_READY)
    assert cond is not None and (cond["status"], cond["reason"]) == ("False", c.REASON_UNSCHEDULABLE)
    assert "fashion-data-1: Unschedulable: no cpu" in cond["message"] and "run on the ready ones" in cond["message"]
    assert data_worker_events([], patch["conditions"]) == [("Warning", c.REASON_UNSCHEDULABLE, cond["message"])]

    full = data_worker_status("fashion", summarize_data_workers([data_pod(job, 0), data_pod(job, 1)], 2),
                              phase=c.PHASE_RUNNING, kept=True, refused=None, conditions=patch["conditions"],
                              now=NOW, generation=3)
    cond = get_condition(full["conditions"], c.COND_DATA_WORKERS_READY)
    assert cond is not None and cond["status"] == "True" and full["dataWorkers"]["problems"] == []
    assert data_worker_events(patch["conditions"], full["conditions"])[0][:2] == ("Normal", c.REASON_DATA_WORKERS_READY)


def test_a_refused_creation_is_the_reason_and_none_ready_means_the_ranks_make_their_batches() -> None:
    summary = summarize_data_workers([], 2)
    patch = data_worker_status("fashion", summary, phase=c.PHASE_STARTING, kept=True,
                               refused=(c.REASON_QUOTA_EXCEEDED, "the API server refused the data worker pod: exceeded quota"),
                               conditions=[], now=NOW, generation=None)
    cond = get_condition(patch["conditions"], c.COND_DATA_WORKERS_READY)
    assert cond is not None and cond["reason"] == c.REASON_QUOTA_EXCEEDED
    assert "exceeded quota" in cond["message"] and "run on the ranks' own pods" in cond["message"]


@pytest.mark.parametrize(("phase", "queued"), [(c.PHASE_SUCCEEDED, False), (c.PHASE_SUSPENDED, False),
                                               (c.PHASE_PENDING, True)])
def test_a_job_finished_suspended_or_queued_keeps_no_data_workers_and_says_so_without_a_warning(
        phase: str, queued: bool) -> None:
    assert not keeps_data_workers(phase, queued) and keeps_data_workers(c.PHASE_RESTARTING, False)
    patch = data_worker_status("fashion", summarize_data_workers([], 2), phase=phase, kept=False, refused=None,
                               conditions=[], now=NOW, generation=None)
    cond = get_condition(patch["conditions"], c.COND_DATA_WORKERS_READY)
    assert cond is not None and (cond["status"], cond["reason"]) == ("False", c.REASON_DATA_WORKERS_NOT_KEPT)
    assert data_worker_events([], patch["conditions"]) == []


def test_the_data_workers_wait_for_the_gang_s_pods_to_be_created_first() -> None:
    """A creation pass before the status pass has recorded the attempt creates no rank: it must create no
    data worker either, or a quota with room for the gang alone is taken by the helpers first."""
    assert not creates_data_workers(c.PHASE_PENDING, False, gang_waits=True)
    assert creates_data_workers(c.PHASE_PENDING, False, gang_waits=False)
    assert not creates_data_workers(c.PHASE_PENDING, True, gang_waits=False)
