"""`make demo`'s pieces without a cluster: the job file as a user applies it, with only its S3 endpoint
replaced, the pod runner's steering kept out of it, and the rows it shows."""

from __future__ import annotations

import subprocess

import pytest
import yaml

import demo

ENDPOINT = "http://10.244.200.1:41157"


def test_the_demo_job_is_the_file_a_user_applies_to_a_real_cluster() -> None:
    job = yaml.safe_load(demo.JOB_FILE.read_text())
    assert "template" not in job["spec"], "no node steering: its ranks go wherever the cluster puts them"
    assert job["spec"]["image"].startswith("ddp-operator/trainer:")
    assert job["spec"]["s3"]["credentialsSecret"] == "s3-credentials"
    args = job["spec"]["args"]
    assert "--holdout-every" in args, "the demo prints a held-out accuracy"


def test_only_the_s3_endpoint_is_replaced() -> None:
    written = demo.JOB_FILE.read_text()
    replaced = demo.with_endpoint(written, ENDPOINT)
    assert yaml.safe_load(replaced)["spec"]["s3"]["endpoint"] == ENDPOINT
    changed = [(a, b) for a, b in zip(written.splitlines(), replaced.splitlines(), strict=True) if a != b]
    assert len(changed) == 1 and "endpoint:" in changed[0][0], changed  # comments and all else as written
    with pytest.raises(ValueError, match="one s3 endpoint"):
        demo.with_endpoint("spec: {}\n", ENDPOINT)


def test_local_runner_steering_is_added_for_the_pod_runners_jobs_only() -> None:
    job = demo.on_local_runner(yaml.safe_load(demo.JOB_FILE.read_text()))
    template = job["spec"]["template"]["spec"]
    assert template["nodeSelector"] == {demo.RUNNER_TAINT: "true"}
    assert template["tolerations"] == [{"key": demo.RUNNER_TAINT, "operator": "Exists", "effect": "NoSchedule"}]
    assert demo.pin_to_node(job, "runner-1")["spec"]["template"]["spec"]["nodeSelector"] == {
        demo.RUNNER_TAINT: "true", "kubernetes.io/hostname": "runner-1"}


def test_job_rows_show_a_row_when_more_than_its_age_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = iter([
        "shapes   Pending   0/2   0   WaitingForRanks   0s\n",
        "shapes   Pending   0/2   0   WaitingForRanks   1s\n",
        subprocess.CalledProcessError(1, "kubectl", stderr="connection refused"),
        "shapes   Running   2/2   0   AllRanksReady   2s\n",
        "shapes   Running   2/2   0   AllRanksReady   3s\n",
        "shapes   Succeeded   0/2   0   AllRanksSucceeded   9s\n",
    ])

    def kubectl(*args: str, input: str | None = None) -> str:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(demo, "kubectl", kubectl)
    monkeypatch.setattr(demo.time, "sleep", lambda seconds: None)
    rows = list(demo.job_rows("shapes", "ddp-demo", timeout_s=60))
    assert [row.split()[1] for row in rows] == ["Pending", "Running", "Succeeded"], rows


def test_a_quiet_step_keeps_its_output_in_the_log_and_says_how_it_ended(tmp_path, capsys) -> None:
    log = tmp_path / "step.log"
    demo.quiet_step("a build", ["bash", "-c", "echo compiling; echo warning >&2"], log)
    said = capsys.readouterr().out
    assert said.splitlines()[0] == "[demo] a build ..." and said.splitlines()[1].startswith("[demo] a build: done in ")
    assert "compiling" not in said and log.read_text().split() == ["compiling", "warning"]
    with pytest.raises(SystemExit, match=r"(?s)a start failed \(exit 3\); the end of .*step\.log:\n.*no room"):
        demo.quiet_step("a start", ["bash", "-c", "echo no room; exit 3"], log)


def test_quiet_steps_run_side_by_side_and_name_the_one_that_failed(tmp_path, capsys) -> None:
    flag = tmp_path / "flag"
    # The first step ends only once the second has run: one after the other, it would fail.
    waits = f"for i in $(seq 300); do [ -e {flag} ] && exit 0; sleep 0.1; done; exit 1"
    demo.quiet_steps([("a wait", ["bash", "-c", waits], tmp_path / "wait.log"),
                      ("a flag", ["touch", str(flag)], tmp_path / "flag.log")])
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["[demo] a wait ...", "[demo] a flag ..."]
    assert sorted(line.split(":")[0] for line in lines[2:]) == ["[demo] a flag", "[demo] a wait"], lines
    with pytest.raises(SystemExit, match=r"(?s)^\[demo\] a failure failed \(exit 4\); the end of .*failure\.log:\nno disk$"):
        demo.quiet_steps([("a failure", ["bash", "-c", "echo no disk; exit 4"], tmp_path / "failure.log"),
                          ("a success", ["true"], tmp_path / "success.log")])
    assert "[demo] a success: done in " in capsys.readouterr().out
