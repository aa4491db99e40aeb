"""The DDPJob and script ConfigMap that submit() builds, and DDPJobs given whole."""

from __future__ import annotations

from pathlib import Path

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
