from __future__ import annotations

from typing import Any

import pytest

from ddp_contract import api, labels
from ddp_contract.jobspec import DEFAULT_INFRASTRUCTURE_BACKOFF_LIMIT, JobSpec, S3Spec
from ddp_operator import constants as c
from ddp_operator.manifests import pod_name, service_name
from ddp_operator.spec import DNS1035_RE, DNS_LABEL_MAX, InvalidSpec, parse_spec, validate_job_name
from specs import changed

MINIMAL: dict[str, Any] = {"worldSize": 2, "image": "trainer:1", "entrypoint": "train.main:run"}


def with_(**changes: Any) -> dict[str, Any]:
    return changed(MINIMAL, **changes)


def test_defaults_are_applied() -> None:
    spec = parse_spec(MINIMAL)
    assert spec == JobSpec(world_size=2, image="trainer:1", entrypoint="train.main:run")
    assert (spec.gpus_per_rank, spec.master_port, spec.backend) == (1, 29500, "auto")
    assert (spec.restart_policy, spec.backoff_limit, spec.suspend) == ("OnFailure", 3, False)
    assert spec.active_deadline_seconds is None and spec.ttl_seconds_after_finished is None
    assert spec.s3 is None and spec.shm_size is None and spec.command is None and spec.image_pull_secrets == ()
    assert spec.node_lost_grace_seconds == 60 and parse_spec({**MINIMAL, "nodeLostGraceSeconds": 0}).node_lost_grace_seconds == 0


def test_full_spec_is_parsed() -> None:
    raw = with_(
        entrypoint=None,
        command=["python", "train.py"],
        args=["--epochs", "3"],
        gpusPerRank=2,
        masterPort=23456,
        backend="nccl",
        shmSize="8Gi",
        env=[{"name": "LR", "value": "0.1"}],
        envFrom=[{"configMapRef": {"name": "cfg"}}],
        imagePullSecrets=[{"name": "regcred"}, {"name": "mirror.creds"}],
        resources={"limits": {"cpu": "4", "memory": "16Gi"}},
        s3={
            "endpoint": "http://minio:9000",
            "region": "us-east-1",
            "credentialsSecret": "s3-creds",
            "dataset": "s3://data/train",
            "results": "s3://out/run1",
        },
        restartPolicy="ExitCode",
        backoffLimit=0,
        activeDeadlineSeconds=3600,
        ttlSecondsAfterFinished=0,
        suspend=True,
        template={"metadata": {"labels": {"team": "a"}}, "spec": {"nodeSelector": {"gpu": "a100"}}},
    )
    spec = parse_spec(raw)
    assert spec.command == ("python", "train.py") and spec.args == ("--epochs", "3")
    assert spec.entrypoint is None
    assert spec.s3 == S3Spec("http://minio:9000", "us-east-1", "s3-creds", "s3://data/train", "s3://out/run1")
    assert (spec.restart_policy, spec.backoff_limit, spec.suspend) == ("ExitCode", 0, True)
    assert spec.template_labels == {"team": "a"} and spec.pod_spec == {"nodeSelector": {"gpu": "a100"}}
    assert spec.shm_size == "8Gi" and spec.master_port == 23456
    assert spec.image_pull_secrets == ("regcred", "mirror.creds")


def test_parse_spec_does_not_alias_the_input() -> None:
    raw = with_(env=[{"name": "A", "value": "1"}], template={"spec": {"volumes": [{"name": "v", "emptyDir": {}}]}})
    spec = parse_spec(raw)
    raw["env"][0]["value"] = "changed"
    raw["template"]["spec"]["volumes"].clear()
    assert spec.env[0]["value"] == "1" and spec.pod_spec["volumes"]


@pytest.mark.parametrize(
    ("gpus", "backend", "expected"),
    [(1, "auto", "nccl"), (0, "auto", "gloo"), (4, "gloo", "gloo"), (1, "nccl", "nccl")],
)
def test_effective_backend(gpus: int, backend: str, expected: str) -> None:
    assert parse_spec(with_(gpusPerRank=gpus, backend=backend)).effective_backend == expected


@pytest.mark.parametrize("shm", ["1Gi", "512Mi", "1e9", "0.5Gi", 1073741824])
def test_valid_shm_sizes(shm: Any) -> None:
    assert parse_spec(with_(shmSize=shm)).shm_size == str(shm)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"worldSize": None}, "worldSize"),
        ({"worldSize": 0}, "worldSize"),
        ({"worldSize": 65537}, "worldSize"),
        ({"worldSize": "2"}, "worldSize"),
        ({"worldSize": True}, "worldSize"),
        ({"image": None}, "image"),
        ({"image": ""}, "image"),
        ({"entrypoint": None}, "entrypoint"),
        ({"command": ["python"]}, "entrypoint"),
        ({"entrypoint": "train.main"}, "entrypoint"),
        ({"entrypoint": "1train:run"}, "entrypoint"),
        ({"entrypoint": None, "command": []}, "command"),
        ({"entrypoint": None, "command": "python train.py"}, "command"),
        ({"args": [1, 2]}, "args"),
        ({"gpusPerRank": -1}, "gpusPerRank"),
        ({"gpusPerRank": 17}, "gpusPerRank"),
        ({"worldSize": 65536, "gpusPerRank": 8}, "gpusPerRank"),
        ({"backend": "mpi"}, "backend"),
        ({"backend": "nccl", "gpusPerRank": 0}, "backend"),
        ({"masterPort": 0}, "masterPort"),
        ({"masterPort": 65536}, "masterPort"),
        ({"restartPolicy": "Always"}, "restartPolicy"),
        ({"backoffLimit": -1}, "backoffLimit"),
        ({"activeDeadlineSeconds": 0}, "activeDeadlineSeconds"),
        ({"startupDeadlineSeconds": 0}, "startupDeadlineSeconds"),
        ({"nodeLostGraceSeconds": -1}, "nodeLostGraceSeconds"),
        ({"ttlSecondsAfterFinished": -5}, "ttlSecondsAfterFinished"),
        ({"suspend": "yes"}, "suspend"),
        ({"shmSize": "lots"}, "shmSize"),
        ({"shmSize": "0Gi"}, "shmSize"),
        ({"resources": {"limits": {c.GPU_RESOURCE: 2}}}, "resources.limits"),
        ({"resources": {"requests": {c.GPU_RESOURCE: 1}}}, "resources.requests"),
        ({"resources": ["cpu"]}, "resources"),
        ({"resources": {"limits": {"cpu": -1}}}, "resources.limits.cpu"),
        ({"resources": {"requests": {"memory": "-1Gi"}}}, "resources.requests.memory"),
        ({"resources": {"requests": {"memory": "lots"}}}, "resources.requests.memory"),
        ({"resources": {"requests": {"cpu": 1.5}}}, "resources.requests.cpu"),
        ({"resources": {"requests": {"cpu": "1e999999999"}}}, "resources.requests.cpu"),
        ({"shmSize": "1e999999999"}, "shmSize"),
        ({"activeDeadlineSeconds": 2**40}, "activeDeadlineSeconds"),
        ({"ttlSecondsAfterFinished": 2**31}, "ttlSecondsAfterFinished"),
        ({"backoffLimit": 2**31}, "backoffLimit"),
        ({"dataWorkers": {"template": {"metadata": 1}}}, "dataWorkers.template.metadata"),
        ({"template": {"metadata": ["labels"]}}, "template.metadata"),
        ({"template": {"spec": {"containers": 5}}}, "template.spec.containers"),
        ({"template": {"spec": {"tolerations": ["x"]}}}, "template.spec.tolerations"),
        ({"template": {"spec": {"nodeSelector": ["a"]}}}, "template.spec.nodeSelector"),
        ({"template": {"spec": {"nodeSelector": {"gpu": 1}}}}, "template.spec.nodeSelector"),
        ({"template": {"spec": {"volumes": [{"emptyDir": {}}]}}}, "template.spec.volumes[0].name"),
        ({"template": {"spec": {"imagePullSecrets": [{"name": 5}]}}}, "template.spec.imagePullSecrets[0].name"),
        ({"template": {"spec": {"initContainers": [{"name": None}]}}}, "template.spec.initContainers[0].name"),
        ({"template": {"spec": {"securityContext": ["runAsUser"]}}}, "template.spec.securityContext"),
        (
            {"template": {"spec": {"containers": [{"name": "side", "image": "x", "resources": {"limits": [1]}}]}}},
            "template.spec.containers[0].resources",
        ),
        ({"template": {"spec": {"containers": [{"name": ["trainer"]}]}}}, "template.spec.containers[0].name"),
        (
            {"template": {"spec": {"containers": [{"name": "side", "image": "x",
                                                   "resources": {"requests": {"cpu": "1e999999999"}}}]}}},
            "template.spec.containers[0].resources.requests.cpu",
        ),
        (
            {"template": {"spec": {"volumes": [{"name": "v", "emptyDir": {"sizeLimit": "1e999999999"}}]}}},
            "template.spec.volumes[0].emptyDir.sizeLimit",
        ),
        ({"template": {"spec": {"overhead": {"cpu": "-1"}}}}, "template.spec.overhead.cpu"),
        (
            {"dataWorkers": {"template": {"spec": {"resources": {"limits": {"memory": "1e100"}}}}}},
            "dataWorkers.template.spec.resources.limits.memory",
        ),
        ({"template": {"spec": {"containers": [{"name": "trainer", "env": "x"}]}}}, "template.spec.containers[0].env"),
        (
            {"dataWorkers": {"template": {"spec": {"tolerations": [None]}}}},
            "dataWorkers.template.spec.tolerations",
        ),
        ({"env": [{"value": "x"}]}, "env[0].name"),
        ({"env": [{"name": "A", "value": "1"}, {"name": "RANK", "value": "3"}]}, "env[1].name"),
        ({"env": [{"name": "MASTER_ADDR", "value": "x"}]}, "env[0].name"),
        ({"s3": {"dataset": "/data"}}, "s3.dataset"),
        ({"s3": {"results": "s3://"}}, "s3.results"),
        ({"s3": {"endpoint": "minio:9000"}}, "s3.endpoint"),
        ({"s3": {"credentialsSecret": "Bad_Name"}}, "s3.credentialsSecret"),
        ({"s3": {"checksums": "when_required"}}, "s3.checksums"),
        ({"s3": {"addressingStyle": "path"}}, "s3.addressingStyle"),
        ({"s3": {"caBundle": "corp-ca"}}, "s3.caBundle"),
        ({"s3": {"caBundle": {"key": "ca.crt"}}}, "s3.caBundle"),
        ({"s3": {"caBundle": {"configMap": "corp-ca", "key": "a/b"}}}, "s3.caBundle.key"),
        ({"imagePullSecrets": {"name": "regcred"}}, "imagePullSecrets"),
        ({"imagePullSecrets": [{"name": "regcred"}, {}]}, "imagePullSecrets[1].name"),
        ({"imagePullSecrets": ["regcred"]}, "imagePullSecrets[0].name"),
        ({"imagePullSecrets": [{"name": "Reg_Cred"}]}, "imagePullSecrets[0].name"),
        ({"imagePullSecrets": [{"name": "a" * 254}]}, "imagePullSecrets[0].name"),
        ({"imagePullSecrets": [{"name": "regcred"}, {"name": "regcred"}]}, "imagePullSecrets[1].name"),
        (
            {"s3": {"credentialsSecret": "creds"}, "env": [{"name": "AWS_SECRET_ACCESS_KEY", "value": "x"}]},
            "env[0].name",
        ),
        ({"keepFolders": ["out"]}, "keepFolders"),
        ({"keepFolders": ["out", "./out/"], "s3": {"results": "s3://b/r"}}, "keepFolders[1]"),
        ({"keepFolders": ["out", "out/runs"], "s3": {"results": "s3://b/r"}}, "keepFolders[1]"),
        ({"keepFolders": ["../up"], "s3": {"results": "s3://b/r"}}, "keepFolders[0]"),
        ({"keepFolders": [""], "s3": {"results": "s3://b/r"}}, "keepFolders[0]"),
        ({"keepFolders": "out", "s3": {"results": "s3://b/r"}}, "keepFolders"),
        ({"keepFolders": ["out"], "s3": {"results": "s3://b/r"}, "command": ["python", "t.py"], "entrypoint": None,
          "trainerRuntime": "Off"}, "keepFolders"),
        ({"keepFolders": ["out"], "s3": {"results": "s3://b/r"}, "env": [{"name": "DDP_KEEP_FOLDERS", "value": "[]"}]},
         "env[0].name"),
        ({"template": {"metadata": {"labels": {labels.LABEL_RANK: "1"}}}}, "template.metadata.labels"),
        ({"template": {"metadata": {"annotations": {"a": 1}}}}, "template.metadata.annotations"),
        ({"template": {"spec": {"restartPolicy": "OnFailure"}}}, "template.spec.restartPolicy"),
        ({"template": {"spec": {"hostname": "h"}}}, "template.spec.hostname"),
        ({"template": {"spec": {"subdomain": "s"}}}, "template.spec.subdomain"),
        ({"template": {"spec": {"activeDeadlineSeconds": 5}}}, "template.spec.activeDeadlineSeconds"),
        (
            {"template": {"spec": {"containers": [{"name": "trainer", "image": "x"}]}}},
            "template.spec.containers[0].image",
        ),
        (
            {"template": {"spec": {"containers": [{"name": "trainer", "command": ["x"]}]}}},
            "template.spec.containers[0].command",
        ),
        (
            {"template": {"spec": {"containers": [{"name": "trainer", "resources": {}}]}}},
            "template.spec.containers[0].resources",
        ),
        ({"template": {"spec": {"containers": [{"name": "side"}]}}}, "template.spec.containers[0].image"),
        ({"template": {"spec": {"containers": [{"image": "x"}]}}}, "template.spec.containers[0].name"),
        (
            {"template": {"spec": {"containers": [{"name": "s", "image": "x"}, {"name": "s", "image": "y"}]}}},
            "template.spec.containers[1].name",
        ),
        (
            {
                "template": {
                    "spec": {"containers": [{"name": "trainer", "env": [{"name": "WORLD_SIZE", "value": "9"}]}]}
                }
            },
            "template.spec.containers[0].env[0].name",
        ),
        (
            {"shmSize": "1Gi", "template": {"spec": {"volumes": [{"name": c.SHM_VOLUME, "emptyDir": {}}]}}},
            "template.spec.volumes",
        ),
        (
            {
                "shmSize": "1Gi",
                "template": {
                    "spec": {
                        "containers": [{"name": "trainer", "volumeMounts": [{"name": "x", "mountPath": "/dev/shm"}]}]
                    }
                },
            },
            "template.spec.containers",
        ),
    ],
)
def test_invalid_specs_name_the_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidSpec) as caught:
        parse_spec(with_(**changes))
    assert caught.value.field == field
    assert str(caught.value).startswith(f"spec.{field}: ")


def test_a_trainer_container_in_the_template_may_add_fields() -> None:
    template = {"spec": {"containers": [{"name": "trainer", "volumeMounts": [{"name": "d", "mountPath": "/d"}]}]}}
    assert parse_spec(with_(template=template)).pod_spec["containers"][0]["volumeMounts"][0]["mountPath"] == "/d"


@pytest.mark.parametrize(
    ("name", "world_size"),
    [("job", 1), ("a" * 61, 10), ("my-job-2", 65536)],
)
def test_valid_job_names(name: str, world_size: int) -> None:
    validate_job_name(name, world_size)  # accepted: and every name the job then uses is a valid DNS label
    for child in (service_name(name), pod_name(name, 0), pod_name(name, world_size - 1)):
        assert DNS1035_RE.match(child) and len(child) <= DNS_LABEL_MAX, child


@pytest.mark.parametrize(
    ("name", "world_size", "needle"),
    [
        ("Job", 1, "DNS-1035"),
        ("1job", 1, "DNS-1035"),
        ("job.x", 1, "DNS-1035"),
        ("job-", 1, "DNS-1035"),
        ("a" * 61, 11, "63"),
        ("a" * 63, 1, "63"),
    ],
)
def test_invalid_job_names(name: str, world_size: int, needle: str) -> None:
    with pytest.raises(InvalidSpec, match=needle) as caught:
        validate_job_name(name, world_size)
    assert caught.value.field == "metadata.name"
    assert str(caught.value).startswith("metadata.name: ")


def test_restart_budgets_and_hang_timeout() -> None:
    spec = parse_spec(MINIMAL)
    assert (spec.infrastructure_backoff_limit, spec.hang_timeout_seconds) == (DEFAULT_INFRASTRUCTURE_BACKOFF_LIMIT, None)
    spec = parse_spec({**MINIMAL, "infrastructureBackoffLimit": 0, "hangTimeoutSeconds": 600})
    assert (spec.infrastructure_backoff_limit, spec.hang_timeout_seconds) == (0, 600)
    with pytest.raises(InvalidSpec, match=r"env\[0\].name.*DDP_HANG_TIMEOUT_SECONDS is set from spec.hangTimeoutSeconds"):
        parse_spec({**MINIMAL, "hangTimeoutSeconds": 60, "env": [{"name": "DDP_HANG_TIMEOUT_SECONDS", "value": "5"}]})
    with pytest.raises(InvalidSpec, match="hangTimeoutSeconds"):
        parse_spec({**MINIMAL, "hangTimeoutSeconds": -1})


def test_ranks_per_pod_must_divide_the_world() -> None:
    assert parse_spec(MINIMAL).ranks_per_pod == 1
    assert parse_spec({**MINIMAL, "worldSize": 8, "ranksPerPod": 4}).pods == 2
    with pytest.raises(InvalidSpec, match="ranksPerPod.*worldSize 6 is not a multiple of ranksPerPod 4"):
        parse_spec({**MINIMAL, "worldSize": 6, "ranksPerPod": 4})


def test_a_topology_is_required_or_preferred_by_a_node_label() -> None:
    assert parse_spec(MINIMAL).topology is None
    required = parse_spec(with_(topology={"required": "topology.kubernetes.io/zone"})).topology
    assert required is not None and (required.key, required.required) == ("topology.kubernetes.io/zone", True)
    preferred = parse_spec(with_(topology={"preferred": "rack"})).topology
    assert preferred is not None and (preferred.key, preferred.required) == ("rack", False)


@pytest.mark.parametrize(("topology", "field", "needle"), [
    ({}, "topology", "exactly one of required and preferred"),
    ({"required": "rack", "preferred": "zone"}, "topology", "exactly one of required and preferred"),
    ({"required": "no spaces"}, "topology.required", "'no spaces' is not a node label key"),
    ({"preferred": "Upper.Case/rack"}, "topology.preferred", "not a node label key"),
    ("rack", "topology", "must be an object"),
])
def test_a_bad_topology_is_refused_naming_the_field(topology: Any, field: str, needle: str) -> None:
    with pytest.raises(InvalidSpec, match=needle) as caught:
        parse_spec(with_(topology=topology))
    assert caught.value.field == field


def test_managed_by_names_a_controller_and_defaults_to_the_operator() -> None:
    assert parse_spec(MINIMAL).managed_by == api.MANAGED_BY_OPERATOR
    assert parse_spec(with_(managedBy=api.MANAGED_BY_MULTIKUEUE)).managed_by == api.MANAGED_BY_MULTIKUEUE
    assert parse_spec(with_(managedBy="example.com/my-scheduler")).managed_by == "example.com/my-scheduler"


@pytest.mark.parametrize("value", ["multikueue", "Kueue.x-k8s.io/multikueue", "example.com/", "/path",
                                   "example.com/" + "x" * 52, 7])
def test_a_managed_by_that_is_no_controller_name_is_refused(value: Any) -> None:
    with pytest.raises(InvalidSpec) as caught:
        parse_spec(with_(managedBy=value))
    assert caught.value.field == "managedBy"
