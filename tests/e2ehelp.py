"""What the end-to-end tests share: the S3 bucket their jobs use and the jobs they make (the fixtures are
in tests/e2e/conftest.py)."""

from __future__ import annotations

import json
import os
import sys

import yaml
from kubernetes.client.rest import ApiException

from ddp_contract import api, layout
from kube import REPO, Jobs

sys.path.insert(0, str(REPO / "localcluster"))
import demo

BUCKET = "ddp-e2e"


def demo_job(endpoint: str, name: str, args: list[str]) -> dict:
    job = yaml.safe_load((REPO / "examples" / "ddpjob-demo.yaml").read_text())
    job["metadata"]["name"] = name
    job["spec"]["s3"].update(endpoint=endpoint, dataset=f"s3://{BUCKET}/shapes/train", results=f"s3://{BUCKET}/results")
    job["spec"]["args"] = args
    return demo.on_local_runner(job)  # the file's ranks go to any node; these to the pod runner's


def start_job(jobs: Jobs, endpoint: str, name: str, args: list[str], job: dict | None = None) -> None:
    """Create the job (and the namespace's S3 credentials, where the first job of its test has none yet)."""
    try:
        jobs.core.create_namespaced_secret(jobs.namespace, {
            "metadata": {"name": "s3-credentials"},
            "stringData": {"AWS_ACCESS_KEY_ID": demo.ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": demo.SECRET_KEY},
        })
    except ApiException as error:
        if error.status != 409:
            raise
    job = job or demo_job(endpoint, name, args)
    jobs.custom.create_namespaced_custom_object(api.GROUP, api.VERSION, jobs.namespace, api.PLURAL, job)


def workload_job(endpoint: str, name: str, entrypoint: str, **spec: object) -> dict:
    """A job running one of tests/trainer/ddp_workloads.py's functions (the pod runner's ranks see the tree)."""
    job = demo_job(endpoint, name, [])
    path = os.pathsep.join(str(REPO / p) for p in ("contract", "images/trainer", "tests/trainer"))
    job["spec"].update(entrypoint=entrypoint, env=[{"name": "PYTHONPATH", "value": path}], **spec)
    return job


def recoveries_kept(endpoint: str, namespace: str, name: str) -> dict[int, dict]:
    """Where each attempt resumed from, as the job's rank 0 kept it in S3 (read as the client reads it)."""
    s3 = demo.s3_client(endpoint)
    prefix = f"results/{namespace}/{name}/"
    found: dict[int, dict] = {}
    for item in s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{prefix}{layout.RESTARTS}/").get("Contents", []):
        attempt = layout.parse_attempt_recovery(item["Key"].removeprefix(prefix))
        if attempt is not None:
            found[attempt] = json.loads(s3.get_object(Bucket=BUCKET, Key=item["Key"])["Body"].read())
    return found
