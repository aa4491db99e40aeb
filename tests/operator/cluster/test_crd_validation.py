"""The DDPJob CRD against a real kube-apiserver: schema, defaults, CEL rules, status subresource."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddp_contract import api, backend, labels
from ddp_contract.jobspec import DEFAULT_BACKOFF_LIMIT, DEFAULT_GPUS_PER_RANK, DEFAULT_MASTER_PORT, POLICY_ON_FAILURE
from ddp_operator import constants as c
from ddp_operator.decision import Action, Decision
from ddp_operator.failures import RankFailure
from ddp_operator.podsummary import summarize_pods
from ddp_operator.spec import parse_spec
from ddp_operator.statuspatch import compute_status
from kube import REPO
from specs import FULL_TEMPLATE, changed

pytestmark = pytest.mark.cluster

EXAMPLES = sorted((REPO / "examples").glob("ddpjob-*.yaml"))

VALID_SPEC: dict[str, Any] = {"worldSize": 2, "image": "trainer:1", "entrypoint": "train.main:run"}


@pytest.fixture(scope="module")
def custom(kube_api: Any, crd: None) -> Any:
    from kubernetes import client

    return client.CustomObjectsApi(kube_api)


def ddpjob(spec: dict[str, Any], name: str = "job") -> dict[str, Any]:
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name}, "spec": spec}


def create(custom: Any, namespace: str, body: dict[str, Any], dry_run: bool = True) -> dict[str, Any]:
    kwargs = {"dry_run": "All"} if dry_run else {}
    return custom.create_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, body, **kwargs)


def refusal(custom: Any, namespace: str, body: dict[str, Any]) -> str:
    """The API server's message for a refused create; fails the test if it is accepted."""
    from kubernetes.client.rest import ApiException

    with pytest.raises(ApiException) as caught:
        create(custom, namespace, body)
    assert caught.value.status == 422, caught.value.body
    return json.loads(caught.value.body)["message"]


def spec_with(**changes: Any) -> dict[str, Any]:
    return changed(VALID_SPEC, **changes)


def test_a_command_job_defaults_to_the_runtime_and_takes_launchers_and_restarts_in_place(
        custom: Any, namespace: str) -> None:
    created = create(custom, namespace, ddpjob(spec_with(entrypoint=None, command=["torchrun", "train.py"],
                                                         restartStrategy="InPlace")))
    assert (created["spec"]["trainerRuntime"], created["spec"]["launcher"]) == ("Auto", "Auto")
    spawned = create(custom, namespace, ddpjob(spec_with(entrypoint=None, command=["python", "spawn.py"], worldSize=4,
                                                         ranksPerPod=2, launcher="Command")))
    assert parse_spec(spawned["spec"]).launcher == "Command"


def test_valid_job_is_accepted_with_defaults(custom: Any, namespace: str) -> None:
    created = create(custom, namespace, ddpjob(VALID_SPEC))
    spec = created["spec"]
    assert spec["masterPort"] == DEFAULT_MASTER_PORT
    assert spec["backoffLimit"] == DEFAULT_BACKOFF_LIMIT
    assert spec["gpusPerRank"] == DEFAULT_GPUS_PER_RANK
    assert spec["backend"] == backend.AUTO
    assert spec["restartPolicy"] == POLICY_ON_FAILURE
    assert spec["suspend"] is False


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_accepted(custom: Any, namespace: str, path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        created = create(custom, namespace, doc)
        assert created["metadata"]["name"] == doc["metadata"]["name"]
        parse_spec(created["spec"])  # what the server stores, the operator can run


def test_a_full_template_is_accepted(custom: Any, namespace: str) -> None:
    spec = spec_with(
        template=FULL_TEMPLATE,
        shmSize="8Gi",
        gpusPerRank=8,
        backend="nccl",
        resources={"limits": {"cpu": 8, "memory": "64Gi"}, "requests": {"cpu": "4"}},
        s3={
            "endpoint": "https://s3.example.com",
            "region": "eu-1",
            "credentialsSecret": "creds",
            "dataset": "s3://b/d",
            "results": "s3://b/r",
        },
        env=[
            {"name": "LR", "value": "0.1"},
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        envFrom=[{"configMapRef": {"name": "cfg"}}],
        imagePullSecrets=[{"name": "regcred"}, {"name": "mirror"}],
    )
    created = create(custom, namespace, ddpjob(spec))
    assert created["spec"]["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror"}]
    assert created["spec"]["template"]["spec"]["securityContext"] == {"runAsUser": 1000}
    assert created["spec"]["env"][1]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    parse_spec(created["spec"])


def rule_refusal(field: str, message: str) -> re.Pattern[str]:
    """The API server's refusal by a CRD validation rule whose fieldPath is FIELD: 1.30 and 1.34 put the
    object's type before the message (`Invalid value: "object": `), 1.37 does not."""
    return re.compile(re.escape(f"{field}: Invalid value: ") + '(?:"object": )?' + re.escape(message))


INVALID: list[tuple[str, dict[str, Any], str | re.Pattern[str]]] = [
    ("worldSize missing", spec_with(worldSize=None), "spec.worldSize: Required value"),
    ("worldSize 0", spec_with(worldSize=0), "spec.worldSize: Invalid value"),
    ("worldSize too large", spec_with(worldSize=65537), "spec.worldSize: Invalid value"),
    ("image missing", spec_with(image=None), "spec.image: Required value"),
    ("no program", spec_with(entrypoint=None), "spec.entrypoint: Invalid value"),
    ("entrypoint and command", spec_with(command=["python"]), "exactly one of spec.entrypoint"),
    ("entrypoint form", spec_with(entrypoint="train.py"), "spec.entrypoint must look like package.module:function"),
    ("empty command", spec_with(entrypoint=None, command=[]), "spec.command: Invalid value"),
    ("negative gpus", spec_with(gpusPerRank=-1), "spec.gpusPerRank: Invalid value"),
    ("too many gpus", spec_with(worldSize=65536, gpusPerRank=8), "worldSize * gpusPerRank must not exceed"),
    ("unknown backend", spec_with(backend="mpi"), 'spec.backend: Unsupported value: "mpi"'),
    (
        "nccl on cpu",
        spec_with(backend="nccl", gpusPerRank=0),
        rule_refusal("spec.backend", "spec.backend nccl requires"),
    ),
    ("master port 0", spec_with(masterPort=0), "spec.masterPort: Invalid value"),
    ("master port too large", spec_with(masterPort=65536), "spec.masterPort: Invalid value"),
    ("restart policy", spec_with(restartPolicy="Always"), 'spec.restartPolicy: Unsupported value: "Always"'),
    ("negative backoff", spec_with(backoffLimit=-1), "spec.backoffLimit: Invalid value"),
    ("zero deadline", spec_with(activeDeadlineSeconds=0), "spec.activeDeadlineSeconds: Invalid value"),
    ("negative ttl", spec_with(ttlSecondsAfterFinished=-1), "spec.ttlSecondsAfterFinished: Invalid value"),
    # Past what the operator holds: a deadline past the calendar's end, budgets past int32.
    ("deadline of 2^40 s", spec_with(activeDeadlineSeconds=2**40), "spec.activeDeadlineSeconds: Invalid value"),
    ("ttl past int32", spec_with(ttlSecondsAfterFinished=2**31), "spec.ttlSecondsAfterFinished: Invalid value"),
    ("backoff past int32", spec_with(backoffLimit=2**31), "spec.backoffLimit: Invalid value"),
    ("grace past int32", spec_with(nodeLostGraceSeconds=2**31), "spec.nodeLostGraceSeconds: Invalid value"),
    ("negative cpu", spec_with(resources={"limits": {"cpu": -1}}), "spec.resources.limits.cpu: Invalid value"),
    ("negative memory", spec_with(resources={"requests": {"memory": "-1Gi"}}), "spec.resources.requests.memory: Invalid"),
    (
        "a quantity's exponent of three digits",
        spec_with(dataWorkers={"resources": {"requests": {"cpu": "1e100"}}}),
        "spec.dataWorkers.resources.requests.cpu: Invalid value",
    ),
    # Refused at once: quantity() in the CEL rule would outlast the request's timeout on it.
    ("shm exponent", spec_with(shmSize="1e999999999"), "spec.shmSize must be a positive quantity"),
    ("suspend not bool", spec_with(suspend="yes"), "spec.suspend: Invalid value"),
    ("shm not a quantity", spec_with(shmSize="lots"), "spec.shmSize: Invalid value"),
    ("shm zero", spec_with(shmSize="0"), "spec.shmSize must be a positive quantity"),
    ("dataset not s3", spec_with(s3={"dataset": "/data/train"}), "spec.s3.dataset must be an s3://"),
    ("results not s3", spec_with(s3={"results": "https://b/r"}), "spec.s3.results must be an s3://"),
    ("endpoint not url", spec_with(s3={"endpoint": "minio:9000"}), "spec.s3.endpoint must be an http(s)://"),
    ("secret name", spec_with(s3={"credentialsSecret": "Bad_Name"}), "spec.s3.credentialsSecret: Invalid value"),
    ("reserved env", spec_with(env=[{"name": "RANK", "value": "3"}]), "spec.env must not set MASTER_ADDR"),
    (
        "credentials env",
        spec_with(s3={"credentialsSecret": "creds"}, env=[{"name": "AWS_SECRET_ACCESS_KEY", "value": "x"}]),
        rule_refusal("spec.env", "spec.env must not set AWS_ACCESS_KEY_ID"),
    ),
    ("env without name", spec_with(env=[{"value": "x"}]), "spec.env[0].name: Required value"),
    ("pull secret without name", spec_with(imagePullSecrets=[{}]), "spec.imagePullSecrets[0].name: Required value"),
    (
        "pull secret name",
        spec_with(imagePullSecrets=[{"name": "Reg_Cred"}]),
        "spec.imagePullSecrets[0].name: Invalid value",
    ),
    (
        "pull secret twice",
        spec_with(imagePullSecrets=[{"name": "regcred"}, {"name": "regcred"}]),
        "spec.imagePullSecrets[1]: Duplicate value",
    ),
    (
        "gpu in limits",
        spec_with(resources={"limits": {c.GPU_RESOURCE: 1}}),
        "spec.resources.limits must not set nvidia.com/gpu",
    ),
    (
        "bad quantity",
        spec_with(resources={"requests": {"memory": "lots"}}),
        "spec.resources.requests.memory: Invalid value",
    ),
    (
        "reserved label",
        spec_with(template={"metadata": {"labels": {labels.LABEL_RANK: "0"}}}),
        "spec.template.metadata.labels must not set ddpoperator.io/job-name",
    ),
    (
        "pod restart policy",
        spec_with(template={"spec": {"restartPolicy": "OnFailure"}}),
        'spec.template.spec.restartPolicy: Unsupported value: "OnFailure"',
    ),
    (
        "pod hostname",
        spec_with(template={"spec": {"hostname": "x"}}),
        "spec.template.spec.hostname and subdomain are set by the operator",
    ),
    (
        "pod deadline",
        spec_with(template={"spec": {"activeDeadlineSeconds": 10}}),
        "spec.template.spec.activeDeadlineSeconds is not supported",
    ),
    (
        "trainer image in template",
        spec_with(template={"spec": {"containers": [{"name": "trainer", "image": "other"}]}}),
        "spec.template.spec.containers[trainer] must not set image",
    ),
    (
        "sidecar without image",
        spec_with(template={"spec": {"containers": [{"name": "logger"}]}}),
        "a sidecar container needs an image",
    ),
    (
        "duplicate containers",
        spec_with(template={"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "a", "image": "y"}]}}),
        "spec.template.spec.containers[1]: Duplicate value",
    ),
    (
        "min world size above world size",
        spec_with(minWorldSize=5, restartStrategy="InPlace"),
        "spec.minWorldSize must not exceed spec.worldSize",
    ),
    (
        "elastic without restarts in place",
        spec_with(minWorldSize=1),
        "spec.minWorldSize below spec.worldSize (an elastic job) needs spec.restartStrategy InPlace",
    ),
    (
        "min world size of part of a pod",
        spec_with(worldSize=4, ranksPerPod=2, minWorldSize=3, restartStrategy="InPlace"),
        "spec.minWorldSize must be a multiple of spec.ranksPerPod",
    ),
    (
        "spare pods without restarts in place",
        spec_with(sparePods=1),
        "spec.sparePods needs spec.restartStrategy InPlace",
    ),
    (
        "spare pods of an elastic job",
        spec_with(sparePods=1, minWorldSize=1, restartStrategy="InPlace"),
        "spec.sparePods is for a job of a fixed size",
    ),
    (
        "in place without the runtime",
        spec_with(entrypoint=None, command=["torchrun", "t.py"], restartStrategy="InPlace", trainerRuntime="Off"),
        "spec.restartStrategy InPlace restarts rank processes inside their pods",
    ),
    ("an entrypoint without the runtime", spec_with(trainerRuntime="Off"), "spec.trainerRuntime Off is for a command"),
    ("an entrypoint that starts ranks", spec_with(launcher="Command"), "spec.launcher Command is for a command"),
    ("a managedBy that is no controller name", spec_with(managedBy="multikueue"), "spec.managedBy: Invalid value"),
    ("unknown launcher", spec_with(launcher="mpirun"), 'spec.launcher: Unsupported value: "mpirun"'),
    ("torchrun's settings", spec_with(env=[{"name": "PET_NNODES", "value": "1"}]), "spec.env must not set MASTER_ADDR"),
    (
        "shm volume name",
        spec_with(shmSize="1Gi", template={"spec": {"volumes": [{"name": "dshm", "emptyDir": {}}]}}),
        rule_refusal("spec.template.spec.volumes", "spec.template.spec.volumes: the volume name 'dshm' is reserved"),
    ),
]


@pytest.mark.parametrize(("spec", "needle"), [case[1:] for case in INVALID], ids=[case[0] for case in INVALID])
def test_invalid_spec_is_refused_naming_the_field(
    custom: Any, namespace: str, spec: dict[str, Any], needle: str | re.Pattern[str]
) -> None:
    refused = refusal(custom, namespace, ddpjob(spec))
    assert needle.search(refused) if isinstance(needle, re.Pattern) else needle in refused, refused


@pytest.mark.parametrize(
    ("name", "world_size", "needle"),
    [
        ("my.job", 2, "metadata.name must be a DNS-1035 label"),
        ("a" * 61, 11, "metadata.name is too long"),
    ],
)
def test_job_name_must_fit_the_pod_hostnames(
    custom: Any, namespace: str, name: str, world_size: int, needle: str
) -> None:
    assert needle in refusal(custom, namespace, ddpjob(spec_with(worldSize=world_size), name=name))


def test_longest_name_that_fits_is_accepted(custom: Any, namespace: str) -> None:
    assert create(custom, namespace, ddpjob(spec_with(worldSize=10), name="a" * 61))["metadata"]["name"] == "a" * 61


def test_a_spare_pod_s_hostname_must_fit_too(custom: Any, namespace: str) -> None:
    spared = spec_with(worldSize=9, sparePods=1, restartStrategy="InPlace")  # pods a...-0 .. a...-9
    assert create(custom, namespace, ddpjob(spared, name="a" * 61))["spec"]["sparePods"] == 1
    assert "metadata.name is too long" in refusal(custom, namespace, ddpjob({**spared, "sparePods": 2}, name="a" * 61))


def test_managed_by_is_set_at_creation_and_never_changed(custom: Any, namespace: str) -> None:
    from kubernetes.client.rest import ApiException

    # Suspended: the session's operator, which may serve this namespace, makes no pods for them.
    create(custom, namespace, ddpjob(spec_with(suspend=True, managedBy=api.MANAGED_BY_MULTIKUEUE), "managed"), False)
    create(custom, namespace, ddpjob(spec_with(suspend=True), "unmanaged"), False)
    for name, value in [("managed", "example.com/other"), ("managed", None), ("unmanaged", api.MANAGED_BY_MULTIKUEUE)]:
        with pytest.raises(ApiException) as caught:
            custom.patch_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, name,
                                                  {"spec": {"managedBy": value}})
        assert caught.value.status == 422 and "spec.managedBy is immutable" in caught.value.body, (name, value)


def test_spare_pods_are_set_at_creation_and_never_changed(custom: Any, namespace: str) -> None:
    from kubernetes.client.rest import ApiException

    create(custom, namespace, ddpjob(spec_with(suspend=True, sparePods=1, restartStrategy="InPlace"), "spared"), False)
    with pytest.raises(ApiException) as caught:
        custom.patch_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, "spared",
                                              {"spec": {"sparePods": 2}})
    assert caught.value.status == 422 and "spec.sparePods cannot change once the job exists" in caught.value.body


def test_status_written_by_the_operator_survives_pruning(custom: Any, namespace: str) -> None:
    """Every field compute_status writes (and the trainer's progress, and kopf's own) is declared."""
    create(custom, namespace, ddpjob(VALID_SPEC), dry_run=False)
    now = datetime(2025, 1, 1, tzinfo=UTC)
    failure = RankFailure(1, "job-1", 137, "OOMKilled", False)
    patch = compute_status(
        parse_spec(spec_with(minWorldSize=1, restartStrategy="InPlace")),  # elastic: members too
        status={"phase": "Running"},
        summary=summarize_pods([], 0, job_name="job"),
        decision=Decision(Action.RESTART, 1, c.REASON_RANK_FAILED, "rank 1 (pod job-1) exited with code 137", failure=failure,
                          members=(0, 1)),
        now=now,
        generation=1,
    )
    extra = {
        "progress": {
            "epoch": 2,
            "step": 300,
            "loss": 0.25,
            "samplesPerSecond": 812.5,
            "percent": 37.5,
            "remainingSeconds": 750,
            "remaining": "12m30s",
            "updatedAt": "2025-01-01T00:00:00Z",
            "accuracy": 0.9,
        },
        "kopf": {"progress": {"reconcile": {"started": "x", "retries": 1}}},
    }
    # Server-side dry run: the answer is the pruned object as it would be stored, and an operator
    # running in this test session cannot write over it before we read it.
    stored = custom.patch_namespaced_custom_object_status(
        api.GROUP, api.VERSION, namespace, api.PLURAL, "job", {"status": {**patch, **extra}}, dry_run="All"
    )["status"]
    assert stored == without_nulls({**patch, **extra})  # a merge patch's null removes the field


def without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [without_nulls(item) for item in value]
    return value
