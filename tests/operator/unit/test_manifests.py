from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ddp_contract import api, commands, envnames, labels
from ddp_contract.failureline import parse_line
from ddp_contract.jobspec import DEFAULT_MASTER_PORT, DEFAULT_NODE_LOST_GRACE_SECONDS
from ddp_operator import constants as c
from ddp_operator.manifests import (
    build_data_worker_pod,
    build_pod,
    build_progress_access,
    build_service,
    master_addr,
    pod_name,
    pod_selector,
    service_name,
)
from ddp_operator.spec import parse_spec
from kube import env_of
from specs import FULL_TEMPLATE


def make_job(name: str = "mnist", namespace: str = "team-a", **spec: Any) -> dict[str, Any]:
    body = {"worldSize": 4, "image": "trainer:1", "entrypoint": "train.main:run", **spec}
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": name, "namespace": namespace, "uid": "uid-123", "generation": 1},
        "spec": body,
    }


def pod_for(job: dict[str, Any], rank: int = 0, attempt: int = 0) -> dict[str, Any]:
    return build_pod(job, parse_spec(job["spec"]), rank, attempt)


def trainer(pod: dict[str, Any]) -> dict[str, Any]:
    return next(x for x in pod["spec"]["containers"] if x["name"] == labels.CONTAINER_NAME)


def test_names() -> None:
    assert service_name("mnist") == "mnist"
    assert pod_name("mnist", 3) == "mnist-3"
    assert pod_selector("mnist") == "ddpoperator.io/job-name=mnist"


def test_master_addr_is_rank_zero_behind_the_headless_service() -> None:
    # '.svc' and no cluster domain: the pod's resolv.conf search list completes the name.
    assert master_addr("mnist", "team-a") == "mnist-0.mnist.team-a.svc"


@pytest.mark.parametrize("port", [None, 23456])
def test_service_is_headless_and_published_before_ready(port: int | None) -> None:
    job = make_job(**({"masterPort": port} if port else {}))
    service = build_service(job, parse_spec(job["spec"]))
    expected_port = port or DEFAULT_MASTER_PORT
    assert service["metadata"]["name"] == "mnist" and service["metadata"]["namespace"] == "team-a"
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {labels.LABEL_JOB_NAME: "mnist"}
    assert service["spec"]["ports"][0]["port"] == expected_port
    assert service["spec"]["ports"][0]["targetPort"] == expected_port
    assert service["metadata"]["labels"][labels.LABEL_JOB_NAME] == "mnist"


def test_service_port_follows_the_parsed_spec() -> None:
    job = make_job()
    assert build_service(job, parse_spec({**job["spec"], "masterPort": 1234}))["spec"]["ports"][0]["port"] == 1234


@pytest.mark.parametrize(("rank", "attempt"), [(0, 0), (3, 0), (2, 5)])
def test_pod_identity(rank: int, attempt: int) -> None:
    pod = pod_for(make_job(), rank, attempt)
    assert pod["metadata"]["name"] == f"mnist-{rank}"
    assert pod["metadata"]["namespace"] == "team-a"
    assert pod["spec"]["hostname"] == f"mnist-{rank}"
    assert pod["spec"]["subdomain"] == "mnist"
    assert pod["spec"]["restartPolicy"] == "Never"
    on_pod = pod["metadata"]["labels"]
    assert on_pod[labels.LABEL_JOB_NAME] == "mnist"
    assert on_pod[labels.LABEL_RANK] == str(rank)
    assert on_pod[labels.LABEL_ATTEMPT] == str(attempt)
    assert pod["metadata"]["annotations"][labels.ANNOTATION_WORLD_SIZE] == "4"


@pytest.mark.parametrize("rank", [0, 1, 3])
def test_rank_env(rank: int) -> None:
    env = env_of(pod_for(make_job(), rank, attempt=2))
    assert env == {
        "MASTER_ADDR": "mnist-0.mnist.team-a.svc",
        "MASTER_PORT": "29500",
        "RANK": str(rank),
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "NODE_RANK": str(rank),
        "DDP_JOB_NAME": "mnist",
        "DDP_JOB_NAMESPACE": "team-a",
        "DDP_JOB_UID": "uid-123",
        "DDP_ATTEMPT": "2",
        "DDP_BACKEND": "nccl",
        "DDP_TARGET_WORLD_SIZE": "4",
        "DDP_ENTRYPOINT": "train.main:run",
        # torchrun's, as Kubeflow's PyTorchJob and TrainJob set them: a launcher forms the job's world.
        "PET_NNODES": "4",
        "PET_NPROC_PER_NODE": "1",
        "PET_NODE_RANK": str(rank),
        "PET_MASTER_ADDR": "mnist-0.mnist.team-a.svc",
        "PET_MASTER_PORT": "29500",
    }
    assert all(isinstance(v, str) for v in env.values())


def test_a_pod_of_several_ranks_tells_a_launcher_its_place_and_the_ranks_to_start() -> None:
    env = env_of(pod_for(make_job(worldSize=8, ranksPerPod=4, masterPort=23456), 1))
    assert {k: v for k, v in env.items() if k.startswith("PET_")} == {
        "PET_NNODES": "2", "PET_NPROC_PER_NODE": "4", "PET_NODE_RANK": "1",
        "PET_MASTER_ADDR": "mnist-0.mnist.team-a.svc", "PET_MASTER_PORT": "23456"}


def test_entrypoint_runs_the_trainer_runtime() -> None:
    container = trainer(pod_for(make_job(args=["--lr", "0.1"])))
    assert container["command"] == ["python", "-m", "ddp_trainer", "run", "--"]
    assert container["args"] == ["--lr", "0.1"]
    assert container["image"] == "trainer:1"


def command_job(command: list[str], **spec: object) -> dict:
    job = make_job(command=command, **spec)
    del job["spec"]["entrypoint"]
    return job


def run_shell(container: dict, tmp_path: Path, runtime: bool) -> list[str]:
    """What the container's shell line runs, with the runtime's command present or not: a stand-in
    records its arguments (the real `sh` runs the line; the runtime's path is pointed at the stand-in)."""
    stand_in = tmp_path / "ddp-trainer"
    stand_in.write_text('#!/bin/sh\nprintf "%s\\n" runtime "$@"\n')
    stand_in.chmod(0o755)
    if not runtime:
        stand_in = tmp_path / "missing" / "ddp-trainer"
    line = container["command"][2].replace(commands.RUNTIME_BIN, str(stand_in))
    argv = [*container["command"][3:], *container.get("args", [])]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("torchrun", "python", "accelerate"):  # stand-ins for the image's
        (bin_dir / name).write_text(f'#!/bin/sh\nprintf "%s\\n" {name} "$@"\n')
        (bin_dir / name).chmod(0o755)
    done = subprocess.run(["/bin/sh", "-c", line, *argv], capture_output=True, text=True,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    return [*done.stdout.splitlines(), *(["exit", str(done.returncode)] if done.returncode else []),
            *done.stderr.splitlines()]


def test_a_command_runs_under_the_runtime_where_the_image_has_it_and_as_it_is_elsewhere(tmp_path: Path) -> None:
    container = trainer(pod_for(command_job(["torchrun", "train.py"], args=["--lr", "0.1"])))
    assert container["command"][:2] == ["/bin/sh", "-c"] and container["args"] == ["--lr", "0.1"]
    assert run_shell(container, tmp_path, runtime=True) == ["runtime", "exec", "--", "torchrun", "train.py", "--lr", "0.1"]
    assert run_shell(container, tmp_path, runtime=False) == ["torchrun", "train.py", "--lr", "0.1"]
    assert envnames.ENTRYPOINT not in env_of(pod_for(command_job(["torchrun", "train.py"])))


def test_trainer_runtime_off_runs_the_command_as_it_is() -> None:
    container = trainer(pod_for(command_job(["torchrun", "train.py"], trainerRuntime="Off")))
    assert container["command"] == ["torchrun", "train.py"]
    assert "args" not in container


def test_a_command_that_is_the_runtime_is_not_wrapped_in_it() -> None:
    command = ["python", "-m", "ddp_trainer", "run", "train.py", "--"]  # as ddp_client ships a script
    assert trainer(pod_for(command_job(command)))["command"] == command


def test_an_in_place_command_needs_the_runtime_and_says_so_where_the_image_has_none(tmp_path: Path) -> None:
    container = trainer(pod_for(command_job(["python", "train.py"], restartStrategy="InPlace")))
    assert run_shell(container, tmp_path, runtime=True) == ["runtime", "exec", "--", "python", "train.py"]
    said = run_shell(container, tmp_path, runtime=False)
    assert said[:2] == ["exit", "2"]
    line = parse_line(said[-1])
    assert line is not None and line.exit_code == 2 and "needs the trainer runtime" in line.error


@pytest.mark.parametrize(("gpus", "backend"), [(0, "gloo"), (1, "nccl"), (8, "nccl")])
def test_gpu_limits_and_backend(gpus: int, backend: str) -> None:
    pod = pod_for(make_job(gpusPerRank=gpus, resources={"limits": {"cpu": "4"}, "requests": {"cpu": "2"}}))
    resources = trainer(pod)["resources"]
    if gpus:
        assert resources["limits"] == {"cpu": "4", c.GPU_RESOURCE: gpus}
        assert resources["requests"] == {"cpu": "2", c.GPU_RESOURCE: gpus}
    else:
        assert c.GPU_RESOURCE not in resources["limits"] and c.GPU_RESOURCE not in resources["requests"]
    assert env_of(pod)[envnames.BACKEND] == backend


def test_gpu_limit_without_other_resources() -> None:
    assert trainer(pod_for(make_job(gpusPerRank=2)))["resources"] == {"limits": {c.GPU_RESOURCE: 2}}


def test_cpu_job_without_resources_has_no_resources_field() -> None:
    assert "resources" not in trainer(pod_for(make_job(gpusPerRank=0)))


def test_shm_is_a_memory_empty_dir_at_dev_shm() -> None:
    pod = pod_for(make_job(shmSize="8Gi", template={"spec": {"volumes": [{"name": "data", "emptyDir": {}}]}}))
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes[c.SHM_VOLUME] == {"name": c.SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}
    assert "data" in volumes
    assert {"name": c.SHM_VOLUME, "mountPath": "/dev/shm"} in trainer(pod)["volumeMounts"]


def test_no_shm_volume_without_shm_size() -> None:
    pod = pod_for(make_job())
    assert "volumes" not in pod["spec"]
    assert "volumeMounts" not in trainer(pod)


S3 = {
    "endpoint": "http://minio.storage:9000",
    "region": "eu-west-1",
    "credentialsSecret": "s3-creds",
    "dataset": "s3://datasets/mnist",
    "results": "s3://results/mnist",
}


def test_s3_settings_become_env_and_credentials_secret_refs() -> None:
    env = env_of(pod_for(make_job(s3=S3), 2))
    assert env[envnames.S3_ENDPOINT] == S3["endpoint"]
    assert env[envnames.S3_REGION] == "eu-west-1"
    assert env[envnames.DATASET_URI] == "s3://datasets/mnist"
    assert env[envnames.RESULTS_URI] == "s3://results/mnist"
    assert env[envnames.AWS_ACCESS_KEY_ID] == {"secretKeyRef": {"name": "s3-creds", "key": "AWS_ACCESS_KEY_ID"}}
    assert env[envnames.AWS_SECRET_ACCESS_KEY] == {"secretKeyRef": {"name": "s3-creds", "key": "AWS_SECRET_ACCESS_KEY"}}


def test_secret_values_are_never_inlined() -> None:
    pod = pod_for(make_job(s3=S3))
    for item in trainer(pod)["env"]:
        if item["name"].startswith("AWS_"):
            assert "value" not in item
    assert "AKIA" not in json.dumps(pod)


def test_partial_s3_settings_only_set_what_is_given() -> None:
    env = env_of(pod_for(make_job(s3={"dataset": "s3://d/x"})))
    assert env[envnames.DATASET_URI] == "s3://d/x"
    for name in (envnames.S3_ENDPOINT, envnames.S3_REGION, envnames.RESULTS_URI, envnames.AWS_ACCESS_KEY_ID):
        assert name not in env


def test_s3_checksums_addressing_and_a_ca_bundle_reach_every_rank_and_data_worker() -> None:
    assert not {envnames.S3_CHECKSUMS, envnames.S3_ADDRESSING_STYLE, envnames.S3_CA_BUNDLE} & set(env_of(pod_for(
        make_job(s3={**S3, "checksums": "Auto", "addressingStyle": "Auto"}))))  # Auto: the runtime decides
    s3 = {**S3, "checksums": "WhenSupported", "addressingStyle": "Virtual", "caBundle": {"configMap": "corp-ca",
                                                                                         "key": "bundle.pem"}}
    job = make_job(s3=s3, dataWorkers={"replicas": 1}, template={"spec": {"volumes": [{"name": "code", "emptyDir": {}}]}})
    spec = parse_spec(job["spec"])
    for pod in (pod_for(job, 1), build_data_worker_pod(job, spec, 0)):
        container = pod["spec"]["containers"][0]
        env = env_of(container)
        assert (env[envnames.S3_CHECKSUMS], env[envnames.S3_ADDRESSING_STYLE]) == ("when_supported", "virtual")
        assert env[envnames.S3_CA_BUNDLE] == "/etc/ddp-operator/s3-ca/ca.crt"
        assert {"name": c.S3_CA_VOLUME, "mountPath": "/etc/ddp-operator/s3-ca", "readOnly": True} in \
            container["volumeMounts"]
        assert {"name": c.S3_CA_VOLUME, "configMap": {"name": "corp-ca", "items": [
            {"key": "bundle.pem", "path": "ca.crt"}]}} in pod["spec"]["volumes"]
        assert {"name": "code", "emptyDir": {}} in pod["spec"]["volumes"]  # the template's stay
    assert env_of(pod_for(make_job(s3={**S3, "checksums": "WhenRequired"})))[envnames.S3_CHECKSUMS] == "when_required"


def test_user_env_comes_after_injected_env_and_env_from_is_kept() -> None:
    pod = pod_for(make_job(env=[{"name": "LR", "value": "0.1"}], envFrom=[{"secretRef": {"name": "wandb"}}]))
    names = [item["name"] for item in trainer(pod)["env"]]
    assert names[-1] == "LR" and names[0] == envnames.MASTER_ADDR
    assert trainer(pod)["envFrom"] == [{"secretRef": {"name": "wandb"}}]


def test_every_rank_gets_the_jobs_image_pull_secrets_then_the_templates_others() -> None:
    assert "imagePullSecrets" not in pod_for(make_job())["spec"]
    job = make_job(imagePullSecrets=[{"name": "regcred"}, {"name": "mirror"}])
    assert [pod_for(job, rank)["spec"]["imagePullSecrets"] for rank in (0, 3)] == \
        [[{"name": "regcred"}, {"name": "mirror"}]] * 2
    template = {"spec": {"imagePullSecrets": [{"name": "team"}, {"name": "regcred"}, {"name": "team"}]}}
    merged = pod_for(make_job(imagePullSecrets=[{"name": "regcred"}], template=template))["spec"]["imagePullSecrets"]
    assert merged == [{"name": "regcred"}, {"name": "team"}]
    assert pod_for(make_job(template=template))["spec"]["imagePullSecrets"] == [{"name": "team"}, {"name": "regcred"}]


def test_template_is_merged() -> None:
    pod = pod_for(make_job(template=FULL_TEMPLATE, shmSize="1Gi"), 1)
    spec = pod["spec"]
    for key in (
        "nodeSelector",
        "affinity",
        "serviceAccountName",
        "imagePullSecrets",
        "priorityClassName",
        "schedulerName",
        "enableServiceLinks",
    ):
        assert spec[key] == FULL_TEMPLATE["spec"][key]
    assert spec["tolerations"][0] == FULL_TEMPLATE["spec"]["tolerations"][0]  # then the node-lost ones
    assert pod["metadata"]["labels"]["team"] == "vision"
    assert pod["metadata"]["annotations"]["note"] == "x"
    assert [x["name"] for x in spec["containers"]] == ["trainer", "logger"]
    container = trainer(pod)
    assert container["imagePullPolicy"] == "Always"
    assert container["image"] == "trainer:1"
    assert container["volumeMounts"] == [
        {"name": "data", "mountPath": "/data"},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    assert [v["name"] for v in spec["volumes"]] == ["data", "dshm"]
    assert env_of(pod)["EXTRA"] == "1" and env_of(pod)[envnames.RANK] == "1"


def test_service_links_off_by_default() -> None:
    assert pod_for(make_job())["spec"]["enableServiceLinks"] is False


def test_building_does_not_mutate_the_job_or_the_spec() -> None:
    job = make_job(template=FULL_TEMPLATE, shmSize="1Gi")
    spec = parse_spec(job["spec"])
    before = json.dumps(job, sort_keys=True), repr(spec)
    first = build_pod(job, spec, 0, 0)
    build_pod(job, spec, 1, 0)
    assert (json.dumps(job, sort_keys=True), repr(spec)) == before
    assert first == build_pod(job, spec, 0, 0)


@pytest.mark.parametrize("rank", [-1, 4])
def test_rank_out_of_range_is_refused(rank: int) -> None:
    with pytest.raises(ValueError, match="outside"):
        pod_for(make_job(), rank)


def test_ranks_run_as_a_per_job_account_allowed_only_to_read_their_job_and_write_its_status() -> None:
    job = make_job()
    spec = parse_spec(job["spec"])
    access = {obj["kind"]: obj for obj in build_progress_access(job, spec)}
    assert pod_for(job)["spec"]["serviceAccountName"] == "mnist-trainer"
    assert access["ServiceAccount"]["metadata"]["name"] == "mnist-trainer"
    assert access["Role"]["rules"] == [
        {"apiGroups": [api.GROUP], "resources": [f"{api.PLURAL}/status"], "resourceNames": ["mnist"],
         "verbs": ["get", "patch"]},
        {"apiGroups": [api.GROUP], "resources": [api.PLURAL], "resourceNames": ["mnist"],
         "verbs": ["get", "list", "watch"]},
    ]
    assert access["RoleBinding"]["subjects"] == [{"kind": "ServiceAccount", "name": "mnist-trainer",
                                                  "namespace": "team-a"}]
    assert access["RoleBinding"]["roleRef"]["name"] == access["Role"]["metadata"]["name"]


def test_a_template_service_account_is_kept_and_bound_instead() -> None:
    job = make_job(template={"spec": {"serviceAccountName": "irsa-reader"}})
    spec = parse_spec(job["spec"])
    kinds = [obj["kind"] for obj in build_progress_access(job, spec)]
    assert kinds == ["Role", "RoleBinding"]
    assert build_progress_access(job, spec)[1]["subjects"][0]["name"] == "irsa-reader"
    assert pod_for(job)["spec"]["serviceAccountName"] == "irsa-reader"


def test_hang_timeout_reaches_the_ranks_only_when_set() -> None:
    assert envnames.HANG_TIMEOUT_SECONDS not in env_of(pod_for(make_job()))
    assert env_of(pod_for(make_job(hangTimeoutSeconds=0)))[envnames.HANG_TIMEOUT_SECONDS] == "0"
    assert env_of(pod_for(make_job(hangTimeoutSeconds=900)))[envnames.HANG_TIMEOUT_SECONDS] == "900"


def test_a_restarted_gang_is_told_the_jobs_last_checkpoint() -> None:
    assert envnames.RESUME_FROM not in env_of(pod_for(make_job()))
    job = {**make_job(), "status": {"lastCheckpoint": {"step": 40, "uri": "s3://b/runs/team-a/mnist/checkpoints/step-000000000040"}}}
    assert env_of(pod_for(job, attempt=1))[envnames.RESUME_FROM] == "s3://b/runs/team-a/mnist/checkpoints/step-000000000040"


def test_ranks_tolerate_a_lost_node_for_the_jobs_grace_only() -> None:
    pod = pod_for(make_job(nodeLostGraceSeconds=45), 0)
    assert pod["spec"]["tolerations"] == [
        {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 45}
        for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
    ]
    default = pod_for(make_job(), 0)["spec"]["tolerations"]
    assert {t["tolerationSeconds"] for t in default} == {DEFAULT_NODE_LOST_GRACE_SECONDS}


@pytest.mark.parametrize("own, added", [
    ({"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 900},
     ["node.kubernetes.io/not-ready"]),
    ({"key": "node.kubernetes.io/not-ready", "operator": "Exists"}, ["node.kubernetes.io/unreachable"]),
    ({"operator": "Exists"}, []),  # tolerates every taint: the template's choice stands
    ({"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoSchedule"},
     ["node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"]),
])
def test_a_template_that_tolerates_a_lost_node_itself_keeps_its_own(own: dict, added: list[str]) -> None:
    pod = pod_for(make_job(template={"spec": {"tolerations": [own]}}), 0)
    assert pod["spec"]["tolerations"][0] == own
    assert [t["key"] for t in pod["spec"]["tolerations"][1:]] == added


def test_a_pod_of_several_ranks_gets_torchruns_environment_and_their_gpus() -> None:
    job = make_job(worldSize=8, ranksPerPod=4, gpusPerRank=1)
    spec = parse_spec(job["spec"])
    assert spec.pods == 2 and list(spec.pod_ranks(1)) == [4, 5, 6, 7]
    pod = pod_for(job, 1)
    env = env_of(pod)
    assert pod["metadata"]["name"] == "mnist-1" and "RANK" not in env and "LOCAL_RANK" not in env
    assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["NODE_RANK"], env["GROUP_RANK"]) == ("8", "4", "1", "1")
    assert trainer(pod)["resources"]["limits"][c.GPU_RESOURCE] == 4
    assert trainer(pod)["command"] == list(c.TRAINER_COMMAND)  # the runtime starts the 4 ranks itself
    with pytest.raises(ValueError, match="pod index 2 is outside 0..1"):
        pod_for(job, 2)


def test_a_program_in_a_pod_of_several_ranks_runs_under_torchrun_a_launcher_never(tmp_path: Path) -> None:
    program = trainer(pod_for(command_job(["python", "train.py"], worldSize=4, ranksPerPod=2, args=["--lr", "0.1"]), 1))
    # Without the runtime, torchrun starts the pod's two ranks from its PET_* settings; the runtime decides
    # the same itself (it can also look into a script the command runs).
    assert run_shell(program, tmp_path, runtime=False) == ["torchrun", "--no-python", "python", "train.py", "--lr", "0.1"]
    assert run_shell(program, tmp_path, runtime=True) == ["runtime", "exec", "--", "python", "train.py", "--lr", "0.1"]
    for launcher in (["torchrun", "train.py"], ["python", "-m", "torch.distributed.launch", "main.py"],
                     ["accelerate", "launch", "train.py"]):
        container = trainer(pod_for(command_job(launcher, worldSize=4, ranksPerPod=2), 1))
        assert run_shell(container, tmp_path, runtime=False)[0] == launcher[0], launcher
    off = trainer(pod_for(command_job(["python", "train.py"], worldSize=4, ranksPerPod=2, trainerRuntime="Off"), 1))
    assert off["command"] == ["torchrun", "--no-python", "python", "train.py"]


def test_metric_lines_the_ranks_print_are_read_unless_the_spec_turns_it_off() -> None:
    assert "DDP_METRICS_FROM_OUTPUT" not in env_of(pod_for(make_job())["spec"]["containers"][0])
    assert env_of(pod_for(make_job(metricsFromOutput=False))["spec"]["containers"][0])["DDP_METRICS_FROM_OUTPUT"] == "false"


def test_kept_folders_go_to_every_rank_as_json_and_need_the_runtime_in_a_command_s_image(tmp_path: Path) -> None:
    s3 = {"results": "s3://bucket/runs"}
    pod = pod_for(make_job(keepFolders=["out", "/workspace/runs"], s3=s3))
    assert json.loads(env_of(pod)[envnames.KEEP_FOLDERS]) == ["out", "/workspace/runs"]
    assert envnames.KEEP_FOLDERS not in env_of(pod_for(make_job(s3=s3)))
    container = trainer(pod_for(command_job(["python", "train.py"], keepFolders=["out"], s3=s3)))
    assert run_shell(container, tmp_path, runtime=True) == ["runtime", "exec", "--", "python", "train.py"]
    said = run_shell(container, tmp_path, runtime=False)
    line = parse_line(said[-1])
    assert said[:2] == ["exit", "2"] and line is not None
    assert line.error.startswith("spec.keepFolders needs the trainer runtime") and "Recreate" not in line.error
