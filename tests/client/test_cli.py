"""`kubectl ddp`'s arguments and its errors (the commands themselves run in tests/e2e/test_client.py)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from ddp_client.cli import main, parser, s3_access
from ddp_client.store import S3Access


def test_flags_win_over_the_environment_which_wins_over_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "env-id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-key")
    monkeypatch.delenv("DDP_S3_ENDPOINT", raising=False)
    args = parser().parse_args(["logs", "j", "-f", "--rank", "2", "--s3-endpoint", "http://flag:9000"])
    assert (args.command, args.follow, args.rank) == ("logs", True, 2)
    assert s3_access(args).over(S3Access(endpoint="http://job:9000", region="eu-west-1")) == \
        S3Access("http://flag:9000", "eu-west-1", "env-id", "env-key")


def test_a_missing_kubeconfig_is_said_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "j", "--kubeconfig", str(tmp_path / "none")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("kubectl ddp status: no usable kubeconfig") and "Traceback" not in err


def test_plot_needs_an_output() -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["plot", "j"])


def test_an_unreachable_api_server_is_said_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as closed:  # a loopback port nothing listens on once this socket is closed
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u", "namespace": "ns"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    assert main(["status", "j", "--kubeconfig", str(kubeconfig)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("kubectl ddp status: cannot reach the Kubernetes API") and f"127.0.0.1:{port}" in err
    assert "Traceback" not in err and err.count("\n") == 1


def test_the_package_installs_kubectl_ddp_with_what_it_needs() -> None:
    """pyproject's console script is this CLI, and the `client` extra brings what the client imports."""
    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    module, function = project["scripts"]["kubectl-ddp"].split(":")
    code = f"import sys; sys.argv[0] = 'kubectl-ddp'; from {module} import {function}; {function}()"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    shown = subprocess.run([sys.executable, "-c", code, "--help"], capture_output=True, text=True, env=env, check=True)
    assert shown.stdout.startswith("usage: kubectl ddp") and all(
        command in shown.stdout for command in ("logs", "results", "plot", "status"))
    extra = {re.split(r"[<>=\[]", requirement)[0].lower() for requirement in project["optional-dependencies"]["client"]}
    assert {"kubernetes", "boto3", "pyyaml", "matplotlib"} <= extra
