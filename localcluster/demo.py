"""`make demo`: the main job, a real DDPJob on the local control plane, end to end.

1. an S3 server on 127.0.0.1:19000 (moto) with a small generated image dataset;
2. the DDPJob CRD, the operator, and the pod runner (ranks run as local processes);
3. examples/ddpjob-demo.yaml applied; its `kubectl get ddpjob` row is shown until it finishes;
4. what the job left in S3: metrics, checkpoints, the model.

Everything this starts stops when it ends; the control plane stays up (`make cluster-down`).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "examples"))  # run as a script from the source tree: datagen is the examples' image maker
import datagen  # noqa: E402

CLUSTER = REPO / "localcluster" / "cluster.sh"
JOB_FILE = REPO / "examples" / "ddpjob-demo.yaml"
NAMESPACE = "ddp-demo"
S3_PORT = 19000
ACCESS_KEY, SECRET_KEY = "demo-access-key", "demo-secret-key"
CLASSES = ("circle", "square", "cross")


class Background:
    """A child process with its output in a log file, stopped with SIGTERM (then SIGKILL)."""

    def __init__(self, name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None) -> None:
        self.log = log_dir / f"{name}.log"
        self.process = subprocess.Popen(argv, stdout=self.log.open("ab"), stderr=subprocess.STDOUT,
                                        env={**os.environ, **(env or {})}, cwd=REPO)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def sh(*argv: str, input: str | None = None) -> str:
    return subprocess.run(argv, input=input, capture_output=True, text=True, check=True).stdout


def cluster(*args: str) -> str:
    return sh("bash", str(CLUSTER), *args)


def kubeconfig() -> str:
    line = next(x for x in cluster("env").splitlines() if x.startswith("export KUBECONFIG="))
    return line.split("=", 1)[1]


def kubectl(*args: str, input: str | None = None) -> str:
    return cluster("kubectl", *args) if input is None else sh("bash", str(CLUSTER), "kubectl", *args, input=input)


def upload_dataset(s3, bucket: str, prefix: str, per_class: int, seed: int = 0) -> int:
    """The demo's image folder (32x32 PNGs of three shapes, examples/datagen.py) into `bucket`."""
    rng = random.Random(seed)
    for shape in CLASSES:
        for i in range(per_class):
            s3.put_object(Bucket=bucket, Key=f"{prefix}/{shape}/{i:04d}.png", Body=datagen.draw(shape, rng))
    return per_class * len(CLASSES)


def s3_client(endpoint: str):
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=ACCESS_KEY,
                        aws_secret_access_key=SECRET_KEY, region_name="us-east-1")


def operator_and_runner(log_dir: Path, node: str | None = None) -> list[Background]:
    """The operator and a pod runner; `node` names the runner's node (default: podrunner's `local-runner`)."""
    env = {"KUBECONFIG": kubeconfig(), "PYTHONPATH": os.pathsep.join(str(REPO / p) for p in ("contract", "operator")),
           "DDP_OPERATOR_METRICS_PORT": "0"}  # any free port: another operator may hold the default
    return [
        Background("operator", [sys.executable, "-m", "ddp_operator"], log_dir, env),
        Background("podrunner", [sys.executable, str(REPO / "localcluster" / "podrunner.py"),
                                 "--log-dir", str(log_dir / "pods"), *(["--node", node] if node else [])], log_dir, env),
    ]


def wait_for_node(node: str, timeout_s: float = 60) -> None:
    """Until the pod runner's node is Ready, so a job applied next is not reported unschedulable first."""
    deadline = time.monotonic() + timeout_s
    while "True" not in kubectl("get", "nodes", "--ignore-not-found", "-o",
                                f"jsonpath={{.items[?(@.metadata.name=='{node}')].status.conditions[?(@.type=='Ready')].status}}"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"node {node} (the pod runner's) is not Ready after {timeout_s:.0f}s")
        time.sleep(0.5)


def pin_to_node(job: dict, node: str) -> dict:
    """`job` with its ranks bound to `node` (by hostname) on top of the local-runner selector it has, so
    that no other pod runner on a shared control plane takes them."""
    template = job["spec"].setdefault("template", {}).setdefault("spec", {})
    template.setdefault("nodeSelector", {})["kubernetes.io/hostname"] = node
    return job


def job_rows(name: str, namespace: str, timeout_s: float) -> Iterator[str]:
    """The job's `kubectl get` row each time it changes, until the job finishes."""
    deadline, last = time.monotonic() + timeout_s, ""
    while time.monotonic() < deadline:
        try:
            row = kubectl("get", "ddpjob", name, "-n", namespace, "--no-headers")
        except subprocess.CalledProcessError as error:  # the API server busy or restarting: ask again
            print(f"[demo] kubectl get ddpjob failed: {error.stderr.strip()}", flush=True)
            time.sleep(2)
            continue
        if row != last:
            last = row
            yield row.rstrip()
        if row.split()[1:2] in (["Succeeded"], ["Failed"]):
            return
        time.sleep(1)
    raise TimeoutError(f"DDPJob {namespace}/{name} did not finish in {timeout_s:.0f}s")


def log_directory(kind: str) -> Path:
    """A fresh folder for this run's logs (the operator's, the pod runner's, each rank's in pods/)."""
    cache = Path(os.environ.get("DDP_CACHE", Path.home() / ".cache" / "ddp-operator"))
    log_dir = cache / kind / time.strftime("%Y%m%d-%H%M%S")
    (log_dir / "pods").mkdir(parents=True, exist_ok=True)
    return log_dir


def start_control_plane() -> None:
    """The local control plane (a no-op when it is up) with the DDPJob CRD served."""
    cluster("up")
    kubectl("apply", "-f", str(REPO / "crds" / "ddpjob.yaml"))
    kubectl("wait", "--for=condition=Established", "crd/ddpjobs.ddpoperator.io", "--timeout=60s")


@contextmanager
def s3_server(port: int = S3_PORT, buckets: tuple[str, ...] = ()) -> Iterator[str]:
    """A moto S3 server on 127.0.0.1:`port` (0: any free port) with `buckets`; yields its endpoint."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per S3 request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        host, bound = server.get_host_and_port()
        endpoint = f"http://{host}:{bound}"
        s3 = s3_client(endpoint)
        for bucket in buckets:
            s3.create_bucket(Bucket=bucket)
        yield endpoint
    finally:
        server.stop()


def fresh_namespace(namespace: str) -> None:
    """`namespace` emptied (deleted and created again) with the S3 credentials Secret the jobs name."""
    kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=true", "--timeout=120s")
    kubectl("create", "namespace", namespace)
    kubectl("-n", namespace, "create", "secret", "generic", "s3-credentials",
            f"--from-literal=AWS_ACCESS_KEY_ID={ACCESS_KEY}", f"--from-literal=AWS_SECRET_ACCESS_KEY={SECRET_KEY}")


def run_job(job: dict, namespace: str, timeout_s: float = 900) -> str:
    """Applies `job`, prints its `kubectl get ddpjobs` row as it changes, then its events; returns its phase."""
    name = job["metadata"]["name"]
    kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump(job))
    print(f"[{name}] kubectl get ddpjobs -n {namespace}")
    print(kubectl("get", "ddpjob", "-n", namespace).splitlines()[0])
    for row in job_rows(name, namespace, timeout_s):
        print(row, flush=True)
    print(kubectl("describe", "ddpjob", name, "-n", namespace).split("Events:")[-1])
    return kubectl("get", "ddpjob", name, "-n", namespace, "-o", "jsonpath={.status.phase}")


def print_objects(s3, bucket: str, prefix: str) -> None:
    print(f"[demo] objects in s3://{bucket}/{prefix}:")
    for item in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", []):
        print(f"  {item['Key']}  ({item['Size']} bytes)")


def main() -> int:
    log_dir = log_directory("demo")
    print(f"[demo] logs in {log_dir}")
    start_control_plane()
    children: list[Background] = []
    with s3_server(S3_PORT, buckets=("ddp-demo",)) as endpoint:
        try:
            s3 = s3_client(endpoint)
            images = upload_dataset(s3, "ddp-demo", "shapes/train", per_class=64)
            print(f"[demo] S3 server at {endpoint}: {images} images in s3://ddp-demo/shapes/train")
            children = operator_and_runner(log_dir)
            fresh_namespace(NAMESPACE)
            phase = run_job(yaml.safe_load(JOB_FILE.read_text()), NAMESPACE)
            print_objects(s3, "ddp-demo", "results/")
            print(f"[demo] {phase}; rank logs in {log_dir / 'pods'}")
            return 0 if phase == "Succeeded" else 1
        finally:
            for child in children:
                child.stop()


if __name__ == "__main__":
    sys.exit(main())
