"""README.md's quick start, typed as a user types it: helm install, kubectl apply, kubectl get ddpjobs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from ddp_operator import constants as c
from ddp_trainer.jobstatus import JobStatusSink
from ddp_trainer.runtime.progress import ProgressReporter
from fakenodes import FAKE_NODE_NAMESPACE_ANNOTATIONS
from kube import REPO, Cluster, Jobs, cluster_script, wait_until

pytestmark = pytest.mark.alone("installs the chart for every namespace (a cluster-wide admission policy)")

COLUMNS = ["NAME", "PHASE", "READY", "RESTARTS", "EPOCH", "STEP", "LOSS", "PROGRESS%", "REASON", "AGE"]


def quick_start_commands() -> list[str]:
    """The indented commands of README.md's quick start, in order."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return [line.strip().split("  #")[0].strip() for line in section.splitlines()
            if line.startswith("    ") and line.strip().startswith(("helm ", "kubectl "))]


def user_shell(cluster: Cluster, namespace: str, home: Path) -> dict[str, str]:
    """A user's environment: kubectl and helm on PATH, a kubeconfig whose context is `namespace`."""
    config = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    for context in config["contexts"]:
        context["context"]["namespace"] = namespace
    kubeconfig = home / "config"
    kubeconfig.write_text(yaml.safe_dump(config))
    path = os.environ["PATH"]
    if cluster.local:
        path = cluster_script("bindir").stdout.strip() + os.pathsep + path
    return {**os.environ, "PATH": path, "KUBECONFIG": str(kubeconfig), "HOME": str(home)}


def test_readme_quick_start_runs_as_written(cluster: Cluster, jobs: Jobs, kube_api, tmp_path: Path) -> None:
    commands = quick_start_commands()
    assert [cmd.split()[:2] for cmd in commands] == [["helm", "install"], ["kubectl", "apply"], ["kubectl", "get"]]
    install, apply, get = commands
    assert install.startswith("helm install ddp-operator charts/")
    assert get == "kubectl get ddpjobs"
    env = user_shell(cluster, jobs.namespace, tmp_path)
    # The manifests stay as written; here their pods go to kwok's fake nodes, which fake Running for
    # images the real node does not have.
    jobs.core.patch_namespace(jobs.namespace, {"metadata": {"annotations": FAKE_NODE_NAMESPACE_ANNOTATIONS}})

    def run(command: str) -> str:
        result = subprocess.run(command, shell=True, cwd=REPO, env=env, capture_output=True, text=True)
        assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
        return result.stdout

    # -n keeps this release apart from other tests' (the ClusterRole is named after the namespace).
    installed = run(f"{install} -n {jobs.namespace}" if " -n " not in install else install)
    try:
        assert "NAME: ddp-operator" in installed and "STATUS: deployed" in installed, installed
        assert run(apply).strip() == "ddpjob.ddpoperator.io/quickstart created"
        job = yaml.safe_load((REPO / apply.split("-f", 1)[1].strip()).read_text())
        jobs.wait_phase("quickstart", c.PHASE_RUNNING, timeout=60)
        world = job["spec"]["worldSize"]
        # What rank 0 of the quick-start job reports (the pods run on kwok nodes here), as README shows it.
        ProgressReporter(JobStatusSink(jobs.namespace, "quickstart", api_client=kube_api), 0).report(
            epoch=7, step=512, loss=0.0731, samples=128, percent=87.5)
        wait_until(lambda: jobs.status("quickstart").get("progress"), 10, "progress in the status")

        header, *rows = [line.split() for line in run(get).splitlines()]
        assert header == COLUMNS
        assert rows == [["quickstart", "Running", f"{world}/{world}", "0", "7", "512", "0.0731", "87.5", "AllRanksReady",
                         rows[0][-1]]], rows
        assert rows[0][-1].endswith("s"), rows  # AGE, e.g. 5s
    finally:
        subprocess.run(["helm", "uninstall", "ddp-operator", "-n", jobs.namespace], env=env, capture_output=True)
