"""What the command jobs on the local cluster's real node share (tests/localcluster/test_real_node_commands.py
and test_real_node_kept.py): the image a user builds FROM the trainer image with the real packages added as
the user guide says (examples/frameworks/), jobs of it, and what their logs and S3 say of them."""

from __future__ import annotations

import json
import re
import subprocess
import threading
from collections.abc import Callable
from typing import Any

import demo
from ddp_contract import labels, layout
from ddp_operator import constants as c
from kube import REPO, Jobs
from realnode import create_job, trainer_image

BUCKET = "ddp-commands"
FRAMEWORKS = REPO / "examples" / "frameworks"
PARAMS = re.compile(r'\{"event": "params"[^}]*\}')


def build_frameworks_image() -> str:
    """The image a user builds FROM the trainer image (examples/frameworks/Dockerfile), in the node."""
    result = subprocess.run(["bash", str(REPO / "images" / "build.sh"), "derived", "frameworks", str(FRAMEWORKS)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return frameworks_image_name()


def frameworks_image_name() -> str:
    return trainer_image().replace("/trainer:", "/frameworks:")


def command_job(jobs: Jobs, name: str, image: str, endpoint: str, command: list[str], **spec: Any) -> None:
    """A command job of the frameworks image, 2 CPU ranks, its results (and so its logs) in S3."""
    if not any(s.metadata.name == "s3-credentials" for s in jobs.core.list_namespaced_secret(jobs.namespace).items):
        jobs.core.create_namespaced_secret(jobs.namespace, {"metadata": {"name": "s3-credentials"}, "stringData": {
            "AWS_ACCESS_KEY_ID": demo.ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": demo.SECRET_KEY}})
    env = [{"name": "OMP_NUM_THREADS", "value": "1"}, {"name": "DDP_PROGRESS_INTERVAL_SECONDS", "value": "1"},
           *spec.pop("env", [])]
    create_job(jobs, name, image=image, command=command, env=env, backoffLimit=spec.pop("backoffLimit", 0),
               resources={"limits": {"memory": "3Gi"}},
               s3={"endpoint": endpoint, "region": "us-east-1", "credentialsSecret": "s3-credentials",
                   "results": f"s3://{BUCKET}/results"}, **spec)


class ProgressWatch:
    """Every status.progress each of the jobs showed while it ran (polled until they all ended)."""

    def __init__(self, jobs: Jobs, names: list[str]) -> None:
        self.jobs, self.names = jobs, names
        self.seen: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> ProgressWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        while not self._stop.wait(0.5):
            for name in self.names:
                status = self.jobs.status(name)
                progress = status.get("progress")
                if status.get("phase") == c.PHASE_RUNNING and progress and progress not in self.seen[name][-1:]:
                    self.seen[name].append(progress)


def params(jobs: Jobs, name: str, pods: int) -> list[dict[str, Any]]:
    found = []
    for index in range(pods):
        log = jobs.log(f"{name}-{index}", labels.CONTAINER_NAME)
        found += [json.loads(p) for p in PARAMS.findall(log)]
    return found


def assert_one_model(found: list[dict[str, Any]], world: int) -> None:
    assert sorted(p["rank"] for p in found) == list(range(world)), found
    assert {p["world_size"] for p in found} == {world} and len({p["digest"] for p in found}) == 1, found


def assert_showed_progress(seen: list[dict[str, Any]], name: str) -> None:
    """Some record, shown while the job trained, had a loss and a percent between 0 and 100."""
    midway = [p for p in seen if p.get("loss") is not None and p.get("percent") is not None and 0 < p["percent"] < 100]
    assert midway, (name, seen)
    assert all(p.get("epoch") is not None or p.get("step") is not None for p in midway), (name, seen)


def assert_ended_complete(status: dict[str, Any], name: str, found: list[dict[str, Any]], steps: int | None) -> None:
    """A job that succeeded shows its run's last step (rank 0's `global_step`, else `steps`), 100% and no time
    left, whatever said how far it was and however fast its last steps came."""
    last = next((p["global_step"] for p in found if p["rank"] == 0 and "global_step" in p), steps)
    progress = status.get("progress") or {}
    assert (progress.get("step"), progress.get("percent"), progress.get("remaining")) == (last, 100.0, "0s"), \
        (name, last, progress)


def assert_output_kept(endpoint: str, namespace: str, name: str, text: str, attempt: int = 0) -> None:
    key = f"results/{namespace}/{name}/{layout.log_part(attempt, 0, 0)}"
    s3 = demo.s3_client(endpoint)
    kept = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=f"results/{namespace}/{name}/").get("Contents", [])]
    assert key in kept, (key, kept)
    body = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read().decode(errors="replace")
    assert text in body, body[-2000:]


def finish(jobs: Jobs, names: list[str], timeout: float = 600) -> None:
    for name in names:
        status = jobs.wait_phase(name, c.PHASE_SUCCEEDED, timeout=timeout)
        assert status["restarts"] == 0, status


def trained_with_progress(jobs: Jobs, names: list[str], meanwhile: Callable[[ProgressWatch], None] | None = None,
                          steps: dict[str, int] | None = None) -> None:
    """Each job succeeds, having trained one model across its 2 ranks, shown how far it was and, at its end,
    its last step (`steps`: those of a script that does not print its global step) and 100%."""
    with ProgressWatch(jobs, names) as watch:
        if meanwhile is not None:
            meanwhile(watch)
        finish(jobs, names)
    for name in names:
        found = params(jobs, name, 2)
        assert_one_model(found, 2)
        assert_showed_progress(watch.seen[name], name)
        assert_ended_complete(jobs.status(name), name, found, (steps or {}).get(name))


RESUME = re.compile(r'\{"event": "resume"[^}]*\}')
# Files kept once unchanged for 2 s, looked at every second: the jobs here are short.
KEEP_FAST = [{"name": "DDP_KEEP_SETTLE_SECONDS", "value": "2"}, {"name": "DDP_KEEP_INTERVAL_SECONDS", "value": "1"}]


def kept_key(namespace: str, name: str, path: str) -> str:
    """The key in BUCKET of a file the job keeps, by its path without the leading '/'."""
    return f"{layout.job_key('results', namespace, name)}/{layout.KEPT}/{path}"


def kept_out_files(endpoint: str, namespace: str, name: str) -> list[str]:
    """What the job keeps of its /home/ddp/out in S3, by path below it."""
    prefix = kept_key(namespace, name, "home/ddp/out/")
    listed = demo.s3_client(endpoint).list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    return sorted(o["Key"][len(prefix):] for o in listed)


def kept_checkpoints(endpoint: str, namespace: str, name: str) -> list[int]:
    """The steps of the job's Trainer checkpoints kept whole in S3 (their trainer_state.json is there)."""
    return sorted(int(n.split("/")[0].split("-")[1]) for n in kept_out_files(endpoint, namespace, name)
                  if n.startswith("checkpoint-") and n.endswith("/trainer_state.json"))


def kept_snapshot_epochs(endpoint: str, namespace: str, name: str, path: str) -> int | None:
    """EPOCHS_RUN of the torchrun example's snapshot as kept in S3 (the epoch whose end it saved: 0 after
    the first), None while none is kept."""
    import io

    import torch

    key = kept_key(namespace, name, path)
    try:
        body = demo.s3_client(endpoint).get_object(Bucket=BUCKET, Key=key)["Body"].read()
    except Exception:  # noqa: BLE001 - botocore's NoSuchKey
        return None
    return int(torch.load(io.BytesIO(body), map_location="cpu")["EPOCHS_RUN"])


def kept_object(endpoint: str, namespace: str, name: str, path: str) -> dict[str, Any] | None:
    """HEAD of a kept file's object (its metadata holds the file's time), None while there is none."""
    key = kept_key(namespace, name, path)
    try:
        return demo.s3_client(endpoint).head_object(Bucket=BUCKET, Key=key)
    except Exception:  # noqa: BLE001 - botocore's 404
        return None
