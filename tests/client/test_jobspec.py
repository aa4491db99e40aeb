"""The DDPJob and script ConfigMap that submit() creates, and DDPJobs given whole."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ddp_client.jobspec import S3, SCRIPT_DIR, build_job, job_name_for, load_job, script_configmap
from ddp_contract import api


def test_a_script_runs_from_its_configmap_mounted_in_the_trainer_container() -> None:
    template = {"spec": {"nodeSelector": {"pool": "gpu"}, "volumes": [{"name": "data", "emptyDir": {}}],
                         "containers": [{"name": "trainer", "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]}}
    job = build_job("scripts/train.py", name="train", image="img:1", world_size=4, gpus=0, args=["--epochs", "2"],
                    s3=S3(results="s3://b/runs", credentials_secret="creds"), env={"A": "1"},
                    spec={"template": template, "backoffLimit": 0})
    spec = job["spec"]
    assert spec["command"] == ["python", "-m", "ddp_trainer", "run", f"{SCRIPT_DIR}/train.py", "--"]
    assert spec["args"] == ["--epochs", "2"] and spec["worldSize"] == 4 and spec["backoffLimit"] == 0
    assert spec["s3"] == {"results": "s3://b/runs", "credentialsSecret": "creds"} and spec["env"] == [{"name": "A", "value": "1"}]
    pod = spec["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "gpu"}
    assert pod["volumes"][-1] == {"name": "ddp-client-code", "configMap": {"name": "train-code"}}
    assert [m["mountPath"] for m in pod["containers"][0]["volumeMounts"]] == ["/data", SCRIPT_DIR]
    assert len(template["spec"]["containers"][0]["volumeMounts"]) == 1  # the caller's template is not changed


def test_module_function_is_the_entrypoint_and_anything_else_is_refused() -> None:
    job = build_job("pkg.train:main", name="t", image="img:1")
    assert job["spec"]["entrypoint"] == "pkg.train:main" and "template" not in job["spec"]
    with pytest.raises(ValueError, match="neither module:function nor a local script"):
        build_job("not a target", name="t", image="img:1")
    with pytest.raises(ValueError, match="must be a DNS label"):
        build_job("a:b", name="Bad_Name", image="img:1")


def test_a_function_in_a_local_script_is_shipped_as_the_script_and_named_to_the_runtime(tmp_path: Path) -> None:
    """`submit("train.py:train")`: not taken for a module named `train.py` (which no rank could import)."""
    job = build_job("train.py:train", name=job_name_for("train.py:train"), image="img:1")
    assert job["metadata"]["name"] == "train" and "entrypoint" not in job["spec"]
    assert job["spec"]["command"] == ["python", "-m", "ddp_trainer", "run", f"{SCRIPT_DIR}/train.py:train", "--"]
    script, helper = tmp_path / "train.py", tmp_path / "lib" / "helpers.py"
    helper.parent.mkdir()
    script.write_text("import helpers\n")
    helper.write_text("X = 1\n")
    assert script_configmap("j", script, [helper])["data"] == {"train.py": "import helpers\n", "helpers.py": "X = 1\n"}
    with pytest.raises(ValueError, match="two files named train.py"):
        script_configmap("j", script, [script])


def test_whole_jobs_load_from_yaml_text_or_a_file_and_other_kinds_are_refused(tmp_path: Path) -> None:
    text = f"apiVersion: {api.API_VERSION}\nkind: {api.KIND}\nmetadata: {{name: j}}\nspec: {{worldSize: 1}}\n"
    (tmp_path / "job.yaml").write_text(text)
    assert load_job(text)["metadata"]["name"] == load_job(str(tmp_path / "job.yaml"))["metadata"]["name"] == "j"
    with pytest.raises(ValueError, match="not a DDPJob"):
        load_job({"kind": "Pod", "apiVersion": "v1"})


def test_names_and_the_configmap(tmp_path: Path) -> None:
    assert job_name_for("my_Train.py") == "my-train" and job_name_for("pkg.train_rn:main") == "train-rn"
    script = tmp_path / "t.py"
    script.write_text("print('hi')\n")
    assert script_configmap("j", script)["data"] == {"t.py": "print('hi')\n"}


def test_a_whole_job_goes_in_its_own_namespace_and_name_and_spec_override_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """README: submit takes a whole DDPJob; spec={...} adds or overrides spec fields; name and namespace as expected."""
    import importlib

    from kubernetes import client

    from ddp_client.job import Job

    submitting = importlib.import_module("ddp_client.submit")  # the package's `submit` is the function

    created: list[tuple[str, dict[str, Any]]] = []

    class Recorder:
        def create_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str,
                                            body: dict[str, Any]) -> dict[str, Any]:
            created.append((namespace, body))
            return body

    class NewJob(Job):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.custom = Recorder()

        def get(self) -> dict[str, Any]:
            raise LookupError("not there yet")

    monkeypatch.setattr(submitting, "Job", NewJob)
    monkeypatch.setattr(submitting, "default_namespace", lambda kubeconfig=None: "context-ns")
    body = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "j", "namespace": "team-a"},
            "spec": {"worldSize": 2, "image": "img:1", "entrypoint": "a:b"}}
    job = submitting.submit(body, api_client=client.ApiClient())
    assert (job.namespace, created[-1][0], created[-1][1]["metadata"]) == ("team-a", "team-a", body["metadata"])
    job = submitting.submit(body, name="k", namespace="team-b", spec={"worldSize": 4}, api_client=client.ApiClient())
    namespace, sent = created[-1]
    assert (job.name, job.namespace, namespace) == ("k", "team-b", "team-b")
    assert sent["metadata"] == {"name": "k", "namespace": "team-b"}
    assert sent["spec"] == {"worldSize": 4, "image": "img:1", "entrypoint": "a:b"}
    assert body["metadata"]["name"] == "j"  # the caller's dict is left alone
    del body["metadata"]["namespace"]
    assert submitting.submit(body, api_client=client.ApiClient()).namespace == "context-ns"
