"""Rank 0 writes progress into its own DDPJob's status, with the identity the operator gives it."""

from __future__ import annotations

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from ddp_contract import api, envnames
from ddp_operator import constants as c
from ddp_operator.manifests import progress_service_account
from ddp_trainer.jobstatus import JobStatusSink, last_checkpoint
from ddp_trainer.jobwatch import JobWatch
from ddp_trainer.runtime.formed import record_formed
from ddp_trainer.runtime.progress import ProgressReporter
from kube import client_as, env_of, wait_until


def test_rank_identity_can_write_its_own_jobs_progress_read_that_job_and_nothing_else(jobs, kube_api, kubectl) -> None:
    jobs.create("mine", worldSize=2)
    jobs.create("theirs", worldSize=1)
    jobs.wait_phase("mine", c.PHASE_RUNNING)
    jobs.wait_phase("theirs", c.PHASE_RUNNING)
    account = progress_service_account("mine")
    assert all(p.spec.service_account_name == account for p in jobs.pods("mine"))

    as_rank = client_as(kube_api, jobs.namespace, account)
    reporter = ProgressReporter(JobStatusSink(jobs.namespace, "mine", api_client=as_rank), min_interval_s=0)
    reporter.report(epoch=3, step=1200, loss=0.4375, samples=512)

    progress = wait_until(lambda: jobs.status("mine").get("progress"), 10, "progress in the status")
    assert (progress["epoch"], progress["step"], progress["loss"]) == (3, 1200, 0.4375)
    assert progress["samplesPerSecond"] > 0 and progress["updatedAt"].endswith("Z")
    row = kubectl("get", "ddpjob", "mine", "-n", jobs.namespace, "--no-headers").stdout.split()
    assert row[:7] == ["mine", "Running", "2/2", "0", "3", "1200", "0.4375"], row

    custom = client.CustomObjectsApi(as_rank)
    with pytest.raises(ApiException) as other_job:
        custom.patch_namespaced_custom_object_status(
            api.GROUP, api.VERSION, jobs.namespace, api.PLURAL, "theirs", {"status": {"progress": {"step": 1}}}
        )
    assert other_job.value.status == 403
    with pytest.raises(ApiException) as spec_write:
        custom.patch_namespaced_custom_object(
            api.GROUP, api.VERSION, jobs.namespace, api.PLURAL, "mine", {"spec": {"worldSize": 1}}
        )
    assert spec_write.value.status == 403
    with pytest.raises(ApiException) as pods:
        client.CoreV1Api(as_rank).list_namespaced_pod(jobs.namespace)
    assert pods.value.status == 403
    # It may read and watch its own job (restartStrategy InPlace), by name only.
    mine = custom.list_namespaced_custom_object(api.GROUP, api.VERSION, jobs.namespace, api.PLURAL,
                                                field_selector="metadata.name=mine")
    assert [item["metadata"]["name"] for item in mine["items"]] == ["mine"]
    watched = JobWatch(jobs.namespace, "mine", api_client=as_rank).start()
    try:
        assert watched.wait(lambda view: True, 30) is not None
    finally:
        watched.stop()
    for selector in ("metadata.name=theirs", None):
        with pytest.raises(ApiException) as listed:
            custom.list_namespaced_custom_object(api.GROUP, api.VERSION, jobs.namespace, api.PLURAL,
                                                 **({"field_selector": selector} if selector else {}))
        assert listed.value.status == 403


def test_operator_status_updates_keep_the_trainers_progress(jobs, kube_api) -> None:
    jobs.create("kept", worldSize=2, backoffLimit=2)
    jobs.wait_phase("kept", c.PHASE_RUNNING)
    sink = JobStatusSink(jobs.namespace, "kept", api_client=client_as(kube_api, jobs.namespace,
                                                                      progress_service_account("kept")))
    sink({"epoch": 1, "step": 10, "loss": 2.5, "samplesPerSecond": 100.0, "updatedAt": "2026-01-01T00:00:00Z"})
    jobs.finish("kept-0", 137)
    jobs.wait_pods("kept", 2, attempt=1)
    status = jobs.wait_phase("kept", c.PHASE_RUNNING)
    assert status["restarts"] == 1
    assert status["progress"]["step"] == 10


def test_progress_write_failure_never_raises_into_training(jobs, kube_api) -> None:
    # A ServiceAccount without the Role: every write is refused, and training goes on.
    client.CoreV1Api(kube_api).create_namespaced_service_account(jobs.namespace, {"metadata": {"name": "nobody"}})
    jobs.create("guarded", worldSize=1)
    jobs.wait_phase("guarded", c.PHASE_RUNNING)
    sink = JobStatusSink(jobs.namespace, "guarded", api_client=client_as(kube_api, jobs.namespace, "nobody"))
    reporter = ProgressReporter(sink, min_interval_s=0)
    assert reporter.report(epoch=0, step=1, loss=1.0, samples=8) is True
    assert "progress" not in jobs.status("guarded")


def test_the_last_checkpoint_rank_0_records_is_where_the_next_gang_resumes(jobs, kube_api) -> None:
    jobs.create("resumes", worldSize=2)
    jobs.wait_phase("resumes", c.PHASE_RUNNING)
    sink = JobStatusSink(jobs.namespace, "resumes", api_client=client_as(kube_api, jobs.namespace,
                                                                         progress_service_account("resumes")))
    uri = "s3://bucket/runs/resumes/checkpoints/step-000000000300"
    assert sink.patch({"lastCheckpoint": last_checkpoint(300, uri)})
    assert all(envnames.RESUME_FROM not in env_of(p) for p in jobs.pods("resumes"))
    jobs.finish("resumes-1", 143)
    pods = jobs.wait_pods("resumes", 2, attempt=1)
    assert all(env_of(p)[envnames.RESUME_FROM] == uri for p in pods)
    assert jobs.wait_phase("resumes", c.PHASE_RUNNING)["lastCheckpoint"]["step"] == 300


def test_rank_0_of_a_restarted_gang_keeps_why_its_attempt_began_in_s3(jobs, kube_api, monkeypatch) -> None:
    """status.attemptCause, read from the answer to rank 0's rendezvous record (its own identity), goes to S3
    as the Event said it: what the dashboard's restart marks say once the Events and the job are gone."""
    import demo
    from ddp_client import Job
    from ddp_client.store import S3Access
    from ddp_trainer.storage import s3 as runtime_s3

    with demo.s3_server(0, buckets=("causes",)) as endpoint:
        results = "s3://causes/runs"
        jobs.create("explains", worldSize=2, s3={"endpoint": endpoint, "results": results})
        jobs.wait_phase("explains", c.PHASE_RUNNING)
        jobs.finish("explains-1", 1, message="ValueError: bad batch")
        jobs.wait_pods("explains", 2, attempt=1)
        cause = jobs.wait_phase("explains", c.PHASE_RUNNING)["attemptCause"]
        assert cause["attempt"] == 1 and (cause["reason"], cause["message"]) in {
            (e.reason, e.message) for e in jobs.events("explains")}
        as_rank = JobStatusSink(jobs.namespace, "explains", api_client=client_as(
            kube_api, jobs.namespace, progress_service_account("explains")))
        for name, value in {"AWS_ACCESS_KEY_ID": demo.ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": demo.SECRET_KEY,
                            envnames.S3_ENDPOINT: endpoint, envnames.RESULTS_URI: results,
                            envnames.JOB_NAME: "explains", envnames.JOB_NAMESPACE: jobs.namespace}.items():
            monkeypatch.setenv(name, value)
        runtime_s3.reset_clients()
        try:
            assert record_formed(0, 1.0, None, sink=as_rank) is None  # the first attempt: nothing to explain
            keeping = record_formed(1, 1.0, None, sink=as_rank)
            assert keeping is not None
            keeping.join(30)
        finally:
            runtime_s3.reset_clients()
        assert jobs.status("explains")["rendezvous"]["attempt"] == 1
        job = Job("explains", jobs.namespace, kube_api, S3Access(endpoint=endpoint, access_key_id=demo.ACCESS_KEY,
                                                                 secret_access_key=demo.SECRET_KEY))
        assert job.attempt_causes() == {1: cause}
