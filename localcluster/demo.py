"""`make demo`: the main job end to end, as a user sees it, in containers on the local cluster's real node.

1. the local control plane and real node, both images (`make images`, built if their sources changed)
   and SeaweedFS, built side by side (each a no-op when cached), then the cluster started (a no-op
   when it is up) and the images loaded into the real node's containerd; what the builders print goes
   to the run's log folder, the demo says only each step's start and end;
2. a real S3 server (SeaweedFS, s3server.py) on the real node's bridge gateway, where the pods reach it, with a small
   generated image dataset, and the `ddp-demo` namespace with the S3 credentials Secret;
3. `helm install` of charts/ into that namespace, serving it only: the operator runs as the chart's
   pod, from its image, under the chart's RBAC;
4. `kubectl apply -f` examples/ddpjob-demo.yaml with only its S3 endpoint replaced: its ranks run in
   trainer-image containers and reach rank 0 as `shapes-0.shapes.ddp-demo.svc`; the job's
   `kubectl get ddpjobs` row is shown as it changes, then `kubectl logs shapes-0` (the loss per epoch,
   the held-out accuracy) and what the job left in S3 (metrics, checkpoints, the model);
5. `helm uninstall` and the S3 server stopped. The control plane stays up (`make cluster-down`), and
   so does the namespace with the finished job and its pods, for `kubectl` to look at.

The helpers below the demo's own steps (`operator_and_runner`, `run_job`, ...) run jobs with the
operator and the pod runner as local processes: `make example` and the end-to-end tests use them.
"""

from __future__ import annotations

import os
import random
import re
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
import s3server  # noqa: E402 - localcluster/, beside this file

CLUSTER = REPO / "localcluster" / "cluster.sh"
JOB_FILE = REPO / "examples" / "ddpjob-demo.yaml"
NAMESPACE = "ddp-demo"
S3_PORT = 19000
ACCESS_KEY, SECRET_KEY = "demo-access-key", "demo-secret-key"
CLASSES = ("circle", "square", "cross")
RUNNER_TAINT = "ddpoperator.io/local-runner"  # podrunner.py's node label and taint
RELEASE = "ddp-operator"


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


def on_local_runner(job: dict) -> dict:
    """`job` with its ranks steered to a pod runner's node (its label and taint), where they run as
    local processes: the demo job itself goes to any node, on the local cluster its real one."""
    template = job["spec"].setdefault("template", {}).setdefault("spec", {})
    template.setdefault("nodeSelector", {})[RUNNER_TAINT] = "true"
    template.setdefault("tolerations", []).append({"key": RUNNER_TAINT, "operator": "Exists", "effect": "NoSchedule"})
    return job


def pin_to_node(job: dict, node: str) -> dict:
    """`job` with its ranks bound to `node` (by hostname) on top of the local-runner selector it has, so
    that no other pod runner on a shared control plane takes them."""
    template = job["spec"].setdefault("template", {}).setdefault("spec", {})
    template.setdefault("nodeSelector", {})["kubernetes.io/hostname"] = node
    return job


def job_rows(name: str, namespace: str, timeout_s: float) -> Iterator[str]:
    """The job's `kubectl get` row each time it changes (but for its AGE), until the job finishes."""
    deadline, last = time.monotonic() + timeout_s, ""
    while time.monotonic() < deadline:
        try:
            row = kubectl("get", "ddpjob", name, "-n", namespace, "--no-headers")
        except subprocess.CalledProcessError as error:  # the API server busy or restarting: ask again
            print(f"[demo] kubectl get ddpjob failed: {error.stderr.strip()}", flush=True)
            time.sleep(2)
            continue
        if row.split()[:-1] != last.split()[:-1]:
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


def start_control_plane(log: Path | None = None) -> None:
    """The local control plane (a no-op when it is up) with the DDPJob CRD served. Its build and start say
    what they do as they go (a cold build takes many minutes), or, given `log`, write it there."""
    up = ["bash", str(CLUSTER), "up"]
    if log is None:
        subprocess.run(up, check=True)
    else:
        quiet_step("the control plane and the real node (started)", up, log)
    kubectl("apply", "-f", str(REPO / "crds" / "ddpjob.yaml"))
    kubectl("wait", "--for=condition=Established", "crd/ddpjobs.ddpoperator.io", "--timeout=60s")


@contextmanager
def s3_server(port: int = S3_PORT, buckets: tuple[str, ...] = (), host: str = "127.0.0.1",
              kind: str | None = None) -> Iterator[str]:
    """A real S3 server (SeaweedFS, s3server.py) on `host`:`port` (0: any free port) with `buckets`,
    checking signatures against ACCESS_KEY/SECRET_KEY; yields its endpoint. `kind` "moto" (or
    $DDP_S3_SERVER=moto): moto's emulation instead, for a test that needs what a real server cannot
    do, which says why."""
    kind = kind or os.environ.get("DDP_S3_SERVER") or "seaweedfs"
    if kind not in ("seaweedfs", "moto"):
        raise ValueError(f"DDP_S3_SERVER={kind!r}: the S3 server is seaweedfs or moto")
    server = s3server.seaweedfs(ACCESS_KEY, SECRET_KEY, host, port) if kind == "seaweedfs" else moto_server(host, port)
    with server as endpoint:
        s3 = s3_client(endpoint)
        for bucket in buckets:
            s3.create_bucket(Bucket=bucket)
        yield endpoint


@contextmanager
def moto_server(host: str, port: int) -> Iterator[str]:
    """moto's S3 emulation in this process, on `host`:`port` (0: any free port)."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per S3 request otherwise
    server = ThreadedMotoServer(ip_address=host, port=port, verbose=False)
    server.start()
    try:
        bound_host, bound = server.get_host_and_port()
        yield f"http://{bound_host}:{bound}"
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
    return watch_job(name, namespace, timeout_s)


def watch_job(name: str, namespace: str, timeout_s: float = 900) -> str:
    """Prints the job's `kubectl get ddpjobs` row as it changes, then its events; returns its phase."""
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


def real_node() -> tuple[str, str]:
    """The real node's name and address (its bridge's gateway, where its pods reach the host):
    the node whose kubelet reports containerd (kwok's fake nodes report none)."""
    for node in yaml.safe_load(kubectl("get", "nodes", "-o", "yaml"))["items"]:
        if node["status"].get("nodeInfo", {}).get("containerRuntimeVersion", "").startswith("containerd://"):
            address = next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP")
            return node["metadata"]["name"], address
    raise RuntimeError("the local cluster has no real node (DDP_REAL_NODE=0?): `make demo` runs its ranks there")


def with_endpoint(manifest: str, endpoint: str) -> str:
    """The job file as written, but for its S3 endpoint."""
    replaced, count = re.subn(r"(?m)^(\s+endpoint:\s*)\S+", lambda m: m.group(1) + endpoint, manifest)
    if count != 1:
        raise ValueError(f"expected one s3 endpoint line in the job file, found {count}")
    return replaced


def user_command(*argv: str) -> str:
    """Runs `kubectl ...` or `helm ...` as a user types it (cluster.sh supplies the binary and the
    kubeconfig), after printing it; returns its output."""
    print(f"$ {' '.join(argv)}", flush=True)
    return cluster(*argv)


def show_rank_log(pod: str, namespace: str, lines: int = 20, tag: str = "demo") -> None:
    """The rank's `kubectl logs` tail (the loss per epoch and the held-out accuracy), and how it found rank 0."""
    env = yaml.safe_load(kubectl("get", "pod", pod, "-n", namespace, "-o", "yaml"))["spec"]["containers"][0]["env"]
    master = {e["name"]: e.get("value") for e in env}
    print(f"[{tag}] the ranks meet rank 0 at MASTER_ADDR={master.get('MASTER_ADDR')} MASTER_PORT={master.get('MASTER_PORT')}")
    print(user_command("kubectl", "logs", pod, "-n", namespace, f"--tail={lines}").rstrip())


def build_images(log: Path | None = None) -> None:
    """`make images`: both images built if their sources changed, and loaded into the real node; what the
    build says goes to `log` if given."""
    build = ["bash", str(REPO / "images" / "build.sh"), "build"]
    if log is None:
        subprocess.run(build, check=True)
    else:
        quiet_step("the images loaded into the node", build, log)


def helm_install(namespace: str) -> None:
    """The chart as a user installs it, its operator serving `namespace` alone (the control plane may be shared)."""
    user_command("helm", "install", RELEASE, os.path.relpath(REPO / "charts") + "/", "-n", namespace,
                 "--set", f"watchNamespaces={{{namespace}}}", "--wait", "--timeout", "180s")


def apply_job_file(path: Path, endpoint: str, namespace: str, log_dir: Path) -> str:
    """`kubectl apply -f` of the job file as written but for its S3 endpoint (a copy in log_dir); its name."""
    written = log_dir / path.name
    written.write_text(with_endpoint(path.read_text(), endpoint))
    print(user_command("kubectl", "apply", "-n", namespace, "-f", str(written)).rstrip())
    return yaml.safe_load(written.read_text())["metadata"]["name"]


def helm_uninstall(namespace: str) -> None:
    try:
        print(user_command("helm", "uninstall", RELEASE, "-n", namespace, "--wait").rstrip())
    except subprocess.CalledProcessError as error:  # e.g. the install failed before it made a release
        print(f"[demo] helm uninstall: {error.stderr.strip()}")


# What a first run builds, on the 2-core EPYC VM from nothing (DEVELOPMENT.md, Measured times).
FIRST_RUN = "21 to 28 minutes on 2 cores"


def quiet_steps(steps: list[tuple[str, list[str], Path]]) -> None:
    """Runs (what, argv, log) steps side by side, each one's own output in its log; says when each is
    done, or, once all have ended, how the first one that failed failed."""
    running = []
    for what, argv, log in steps:
        print(f"[demo] {what} ...", flush=True)
        with log.open("ab") as out:
            running.append((what, log, subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)))
    started = time.monotonic()
    failed: list[str] = []
    while running:
        for entry in [entry for entry in running if entry[2].poll() is not None]:
            running.remove(entry)
            what, log, process = entry
            if process.returncode == 0:
                print(f"[demo] {what}: done in {time.monotonic() - started:.0f} s", flush=True)
            else:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
                failed.append(f"[demo] {what} failed (exit {process.returncode}); the end of {log}:\n{tail}")
        time.sleep(0.2)
    if failed:
        raise SystemExit(failed[0])


def quiet_step(what: str, argv: list[str], log: Path) -> None:
    """Runs a build or start whose own output goes to `log`; says when it is done, or how it failed."""
    quiet_steps([(what, argv, log)])


def build_quietly(log_dir: Path) -> None:
    """The control plane and the node, both images and SeaweedFS built side by side (the images' build
    mostly waits on downloads and one-core compression), each one's output in log_dir; then the cluster
    started and the images loaded into its node."""
    quiet_steps([
        ("the control plane and the real node (built once)", ["bash", str(CLUSTER), "build"], log_dir / "cluster.log"),
        ("the operator and trainer images (make images)", ["bash", str(REPO / "images" / "build.sh"), "build"],
         log_dir / "images.log"),
        ("SeaweedFS, the S3 server (built once)", [sys.executable, str(REPO / "localcluster" / "s3server.py"), "build"],
         log_dir / "seaweedfs-build.log"),
    ])
    start_control_plane(log_dir / "cluster.log")
    build_images(log_dir / "images.log")


def main() -> int:
    started = time.monotonic()
    log_dir = log_directory("demo")
    print(f"[demo] logs in {log_dir}; a first run builds the cluster, SeaweedFS and both images ({FIRST_RUN}), "
          "later runs start in seconds", flush=True)
    build_quietly(log_dir)
    node, gateway = real_node()
    with s3_server(0, buckets=("ddp-demo",), host=gateway) as endpoint:
        s3 = s3_client(endpoint)
        images = upload_dataset(s3, "ddp-demo", "shapes/train", per_class=96)
        print(f"[demo] S3 server at {endpoint} (node {node}'s gateway): {images} images in s3://ddp-demo/shapes/train")
        fresh_namespace(NAMESPACE)
        try:
            helm_install(NAMESPACE)
            name = apply_job_file(JOB_FILE, endpoint, NAMESPACE, log_dir)
            phase = watch_job(name, NAMESPACE, timeout_s=600)
            print(user_command("kubectl", "get", "pods", "-n", NAMESPACE, "-o", "wide").rstrip())
            show_rank_log(f"{name}-0", NAMESPACE)
            print_objects(s3, "ddp-demo", "results/")
        finally:
            helm_uninstall(NAMESPACE)
    print(f"[demo] {phase} in {time.monotonic() - started:.0f} s; the job and its pods stay in namespace {NAMESPACE}")
    return 0 if phase == "Succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
