"""A Kubeflow PyTorchJob as a DDPJob (`kubectl ddp convert`): every field the table in
docs/bringing-code.md names carried over, what has no place said, and the result a DDPJob the operator
takes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ddp_client.cli import main
from ddp_client.convert import ConvertError, from_pytorchjob
from ddp_operator.manifests import build_pod
from ddp_operator.spec import parse_spec
from kube import REPO

# Kubeflow's own example (training-operator examples/pytorch/mnist), with the fields people add to it.
PYTORCHJOB = """
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata:
  name: pytorch-mnist
  namespace: team-a
  labels: {kueue.x-k8s.io/queue-name: gpus}
  annotations:
    kubectl.kubernetes.io/last-applied-configuration: "{}"
    owner: vision
spec:
  nprocPerNode: "4"
  runPolicy:
    backoffLimit: 2
    ttlSecondsAfterFinished: 600
    cleanPodPolicy: None
    schedulingPolicy: {priorityClass: high}
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      restartPolicy: OnFailure
      template:
        spec:
          containers:
            - &pytorch
              name: pytorch
              image: registry.example.com/ml/mnist:1
              command: [torchrun, /opt/mnist/src/mnist.py]
              args: ["--epochs", "10", "--backend", "nccl"]
              ports: [{name: pytorchjob-port, containerPort: 23456}]
              env: [{name: NCCL_DEBUG, value: INFO}]
              resources: {limits: {nvidia.com/gpu: 4, memory: 32Gi}, requests: {cpu: "8"}}
              volumeMounts: [{name: data, mountPath: /data}]
          volumes: &volumes [{name: data, persistentVolumeClaim: {claimName: mnist}}]
          nodeSelector: &nodes {gpu: a100}
    Worker:
      replicas: 3
      restartPolicy: OnFailure
      template:
        metadata: {labels: {team: vision}}
        spec:
          containers:
            - *pytorch
            - {name: metrics, image: registry.example.com/exporter:2}
          volumes: *volumes
          nodeSelector: *nodes
"""


def test_a_pytorchjob_becomes_the_same_gang_running_the_same_command() -> None:
    conversion = from_pytorchjob(yaml.safe_load(PYTORCHJOB))
    job, spec = conversion.job, conversion.job["spec"]
    assert job["metadata"] == {"name": "pytorch-mnist", "namespace": "team-a", "labels": {"kueue.x-k8s.io/queue-name": "gpus"},
                               "annotations": {"owner": "vision"}}
    assert (spec["worldSize"], spec["ranksPerPod"], spec["gpusPerRank"]) == (16, 4, 1)  # 4 pods of 4 GPUs
    assert (spec["image"], spec["command"], spec["args"]) == (
        "registry.example.com/ml/mnist:1", ["torchrun", "/opt/mnist/src/mnist.py"], ["--epochs", "10", "--backend", "nccl"])
    assert spec["resources"] == {"limits": {"memory": "32Gi"}, "requests": {"cpu": "8"}}
    assert (spec["masterPort"], spec["restartPolicy"], spec["backoffLimit"], spec["ttlSecondsAfterFinished"]) == \
        (23456, "OnFailure", 2, 600)
    assert spec["env"] == [{"name": "NCCL_DEBUG", "value": "INFO"}]
    template = spec["template"]
    assert template["metadata"] == {"labels": {"team": "vision"}}
    assert template["spec"]["nodeSelector"] == {"gpu": "a100"} and template["spec"]["priorityClassName"] == "high"
    assert template["spec"]["containers"] == [{"name": "trainer", "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
                                              {"name": "metrics", "image": "registry.example.com/exporter:2"}]
    assert conversion.notes == []
    # The operator takes it, and its pods run the command under torchrun's PET_* settings, as before.
    parsed = parse_spec(spec)
    pod = build_pod({**job, "metadata": {**job["metadata"], "uid": "u"}}, parsed, 1, 0)["spec"]
    trainer = pod["containers"][0]
    assert trainer["command"][-2:] == ["torchrun", "/opt/mnist/src/mnist.py"]
    env = {e["name"]: e.get("value") for e in trainer["env"]}
    pet = (env["PET_NNODES"], env["PET_NPROC_PER_NODE"], env["PET_NODE_RANK"], env["PET_MASTER_PORT"])
    assert pet == ("4", "4", "1", "23456")


def test_an_elastic_pytorchjob_becomes_an_elastic_ddpjob_and_what_has_no_place_is_said() -> None:
    manifest = yaml.safe_load(PYTORCHJOB)
    manifest["spec"]["elasticPolicy"] = {"minReplicas": 2, "maxReplicas": 4, "rdzvBackend": "c10d", "maxRestarts": 5}
    manifest["spec"]["runPolicy"]["cleanPodPolicy"] = "All"
    manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["restartPolicy"] = "Always"
    containers = manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"]
    containers[0] = {**containers[0], "image": "other:1"}  # the Workers' is the same object (a YAML alias)
    conversion = from_pytorchjob(manifest)
    spec = conversion.job["spec"]
    assert (spec["worldSize"], spec["minWorldSize"], spec["restartStrategy"]) == (16, 8, "InPlace")
    said = " | ".join(conversion.notes)
    for words in ("maxRestarts, rdzvBackend", "cleanPodPolicy All", "restartPolicy Always", "differ in image"):
        assert words in said, said
    parse_spec(spec)


@pytest.mark.parametrize(("change", "words"), [
    (lambda m: m.update(kind="TFJob"), "not a PyTorchJob"),
    (lambda m: m["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0].pop("command"),
     "has no command"),
    (lambda m: m["spec"].update(nprocPerNode="many"), "spec.nprocPerNode"),
    (lambda m: m["spec"]["pytorchReplicaSpecs"].update(Launcher={}), "Launcher replicas"),
])
def test_what_cannot_become_a_ddpjob_is_refused_naming_the_field(change, words: str) -> None:
    manifest = yaml.safe_load(PYTORCHJOB)
    change(manifest)
    with pytest.raises(ConvertError, match=words):
        from_pytorchjob(manifest)


def test_kubectl_ddp_convert_writes_the_ddpjob_and_says_what_it_left_out(tmp_path: Path, capsys) -> None:
    manifest = yaml.safe_load(PYTORCHJOB)
    manifest["spec"]["runPolicy"]["cleanPodPolicy"] = "Running"
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(manifest))
    assert main(["convert", "-f", str(tmp_path / "job.yaml")]) == 0
    out, err = capsys.readouterr()
    assert yaml.safe_load(out)["kind"] == "DDPJob" and "not carried over: runPolicy.cleanPodPolicy Running" in err
    assert main(["convert", "-f", str(tmp_path / "missing.yaml")]) == 1
    assert "kubectl ddp convert:" in capsys.readouterr().err
    # The console script reads stdin too.
    done = subprocess.run([sys.executable, "-m", "ddp_client", "convert", "-f", "-"], input=PYTORCHJOB, capture_output=True,
                          text=True, env={"PYTHONPATH": f"{REPO / 'client'}:{REPO / 'contract'}"})
    assert done.returncode == 0 and yaml.safe_load(done.stdout)["spec"]["worldSize"] == 16, done.stderr
