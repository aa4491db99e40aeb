"""A minimal kubelet for the local control plane: runs pods as local processes.

kwok makes pods look Running without running anything. To run a real DDPJob on a machine
without a container engine, this registers one node (`local-runner`, or `--node NAME` for a runner
of one's own on a shared control plane; tainted so only pods that tolerate it land there) and, for
every pod bound to it, starts the trainer container's command as
a process of this machine, in the test virtualenv rather than the image:

- `python` in the command is this interpreter; PYTHONPATH holds the trainer runtime and examples;
- MASTER_ADDR becomes 127.0.0.1: every rank runs here, and cluster DNS does not exist here;
- env values, secretKeyRefs and the downward API's pod name and IP are resolved as a kubelet would; the
  image is ignored; HOSTNAME is the pod's name;
- each pod has a /dev/shm of its own for its memory snapshots (DDP_SNAPSHOT_DIR, under its work directory),
  emptied when the pod starts and when it is deleted;
- a ConfigMap volume mounted in the container is written under the pod's work directory, and
  arguments under its mountPath point there (a process cannot mount at an absolute path);
- pod status follows the process: Running and Ready once started, Succeeded or Failed with the
  exit code when it ends; a deleted pod's process gets SIGTERM, then SIGKILL.

Logs go to <log dir>/<namespace>_<pod>.log. Runs until SIGTERM/SIGINT, then deletes its node.
"""

from __future__ import annotations

import argparse
import base64
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "contract"))  # run as a script from the source tree: the imports below need it
from ddp_contract import kubeclient  # noqa: E402
from podstatus import now, pod_status  # noqa: E402

NODE = "local-runner"
TAINT_KEY = "ddpoperator.io/local-runner"

HEARTBEAT_S = 10
log = logging.getLogger("podrunner")


def node_manifest(cpus: int, memory_gi: int, node: str = NODE, pods: int = 64,
                  labels: dict[str, str] | None = None) -> dict[str, Any]:
    capacity = {"cpu": str(cpus), "memory": f"{memory_gi}Gi", "pods": str(pods), "nvidia.com/gpu": "0"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node, "labels": {TAINT_KEY: "true", "kubernetes.io/hostname": node,
                                               "kubernetes.io/os": "linux", **(labels or {})}},
        "spec": {"taints": [{"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}]},
        "status": {"capacity": capacity, "allocatable": capacity},
    }


def node_status() -> dict[str, Any]:
    stamp = now()
    ready = {"type": "Ready", "status": "True", "reason": "LocalRunnerReady", "message": "podrunner is running",
             "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}
    return {"status": {"conditions": [ready], "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                       "nodeInfo": {"kubeletVersion": "podrunner", "containerRuntimeVersion": "process",
                                    "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64",
                                    "osImage": "", "kernelVersion": "", "machineID": "", "systemUUID": "",
                                    "bootID": ""}}}


@dataclass
class Running:
    process: subprocess.Popen
    started: str


class PodRunner:
    def __init__(self, api: client.ApiClient, log_dir: Path, node: str = NODE, pods: int = 64,
                 labels: dict[str, str] | None = None) -> None:
        self.node = node
        self.pods = pods
        self.labels = labels or {}
        self.core = client.CoreV1Api(api)
        self.leases = client.CoordinationV1Api(api)
        self.log_dir = log_dir
        self.running: dict[tuple[str, str], Running] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()

    # --- node -------------------------------------------------------------------------------

    def register(self) -> None:
        try:
            self.core.create_node(node_manifest(os.cpu_count() or 2, 16, self.node, self.pods, self.labels))
        except ApiException as error:
            if error.status != 409:
                raise
        self.heartbeat()

    def heartbeat(self) -> None:
        self.core.patch_node_status(self.node, node_status())
        lease = {"metadata": {"name": self.node, "namespace": "kube-node-lease"},
                 "spec": {"holderIdentity": self.node, "leaseDurationSeconds": 40,
                          "renewTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")}}
        try:
            self.leases.patch_namespaced_lease(self.node, "kube-node-lease", {"spec": lease["spec"]})
        except ApiException as error:
            if error.status != 404:
                raise
            self.leases.create_namespaced_lease("kube-node-lease", lease)

    def heartbeats(self) -> None:
        while not self.stop.wait(HEARTBEAT_S):
            try:
                self.heartbeat()
            except Exception as error:  # noqa: BLE001 - keep beating through API hiccups
                log.warning("heartbeat failed: %s", error)

    def unregister(self) -> None:
        for call in (lambda: self.core.delete_node(self.node),
                     lambda: self.leases.delete_namespaced_lease(self.node, "kube-node-lease")):
            try:
                call()
            except ApiException:
                pass

    # --- pods -------------------------------------------------------------------------------

    def watch_pods(self) -> None:
        while not self.stop.is_set():
            try:
                self.watch_once()
            except Exception:
                log.exception("pod watch failed; watching again")
                self.stop.wait(1)

    def watch_once(self) -> None:
        stream = watch.Watch().stream(self.core.list_pod_for_all_namespaces,
                                      field_selector=f"spec.nodeName={self.node}", timeout_seconds=30)
        for event in stream:
            pod = event["object"]
            key = (pod.metadata.namespace, pod.metadata.name)
            if event["type"] == "DELETED":
                self.kill(key)
            elif pod.metadata.deletion_timestamp is not None:
                self.kill(key)
                self.remove(pod)
            elif key not in self.running and pod.status.phase == "Pending":
                self.start(pod)
            if self.stop.is_set():
                return

    def start(self, pod: client.V1Pod) -> None:
        key = (pod.metadata.namespace, pod.metadata.name)
        container = pod.spec.containers[0]
        work = self.log_dir / "work" / key[0] / key[1]
        work.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.shm(key), ignore_errors=True)
        try:
            env = self.environment(pod, container)
            mounts = self.configmap_mounts(pod, container, work / "mounts")
        except Exception as error:  # noqa: BLE001 - the pod fails, as with a kubelet
            self.report(pod, "Failed", exit_code=None, reason="CreateContainerConfigError", message=str(error))
            return
        argv = [_mounted(arg, mounts) for arg in [*(container.command or []), *(container.args or [])]]
        if argv and argv[0] in ("python", "python3"):
            argv[0] = sys.executable
        log_path = self.log_dir / f"{key[0]}_{key[1]}.log"
        out = log_path.open("ab")
        process = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=work,
                                   start_new_session=True)
        started = now()
        with self.lock:
            self.running[key] = Running(process, started)
        log.info("started %s/%s (pid %d): %s", *key, process.pid, " ".join(argv)[:200])
        self.report(pod, "Running", started=started)
        threading.Thread(target=self.wait, args=(pod, process, started), daemon=True).start()

    def environment(self, pod: client.V1Pod, container: client.V1Container) -> dict[str, str]:
        env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"),
               "PYTHONUNBUFFERED": "1", "HOSTNAME": pod.metadata.name,
               "DDP_SNAPSHOT_DIR": str(self.shm((pod.metadata.namespace, pod.metadata.name)) / "ddp-snapshots"),
               "PYTHONPATH": os.pathsep.join(str(REPO / p) for p in ("contract", "images/trainer", "examples/trainer"))}
        fields = {"metadata.name": pod.metadata.name, "metadata.namespace": pod.metadata.namespace,
                  "status.podIP": "127.0.0.1", "status.hostIP": "127.0.0.1"}
        for item in container.env or []:
            if item.value is not None:
                env[item.name] = item.value
            elif item.value_from and item.value_from.secret_key_ref:
                ref = item.value_from.secret_key_ref
                secret = self.core.read_namespaced_secret(ref.name, pod.metadata.namespace)
                env[item.name] = base64.b64decode(secret.data[ref.key]).decode()
            elif item.value_from and item.value_from.field_ref and item.value_from.field_ref.field_path in fields:
                env[item.name] = fields[item.value_from.field_ref.field_path]
        env["MASTER_ADDR"] = "127.0.0.1"
        env["KUBECONFIG"] = str(self.service_account_kubeconfig(pod))
        return env

    def configmap_mounts(self, pod: client.V1Pod, container: client.V1Container, root: Path) -> dict[str, Path]:
        """Each ConfigMap volume the container mounts, written under `root`: mountPath -> local dir."""
        volumes = {v.name: v for v in pod.spec.volumes or []}
        mounts: dict[str, Path] = {}
        for mount in container.volume_mounts or []:
            volume = volumes.get(mount.name)
            if volume is None or volume.config_map is None:
                continue
            data = self.core.read_namespaced_config_map(volume.config_map.name, pod.metadata.namespace).data or {}
            local = root / mount.mount_path.lstrip("/")
            local.mkdir(parents=True, exist_ok=True)
            for name, text in data.items():
                (local / name).write_text(text)
            mounts[mount.mount_path.rstrip("/")] = local
        return mounts

    def service_account_kubeconfig(self, pod: client.V1Pod) -> Path:
        """What a kubelet mounts as the pod's token, as a kubeconfig: the pod acts as its ServiceAccount."""
        account = pod.spec.service_account_name or "default"
        request = {"spec": {"expirationSeconds": 3600,
                            "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": pod.metadata.name,
                                               "uid": pod.metadata.uid}}}
        token = self.core.create_namespaced_service_account_token(account, pod.metadata.namespace, request)
        api = self.core.api_client.configuration
        path = self.log_dir / "work" / pod.metadata.namespace / pod.metadata.name / "kubeconfig"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "pod",
            "clusters": [{"name": "local", "cluster": {"server": api.host, "certificate-authority": api.ssl_ca_cert}}],
            "users": [{"name": account, "user": {"token": token.status.token}}],
            "contexts": [{"name": "pod", "context": {"cluster": "local", "user": account,
                                                     "namespace": pod.metadata.namespace}}],
        }))
        return path

    def wait(self, pod: client.V1Pod, process: subprocess.Popen, started: str) -> None:
        code = process.wait()
        key = (pod.metadata.namespace, pod.metadata.name)
        with self.lock:
            current = self.running.get(key)
            if current is None or current.process is not process:
                return  # killed because the pod was deleted
        log.info("%s/%s exited with %d", *key, code)
        code = 128 - code if code < 0 else code  # killed by signal N: report 128+N like a runtime
        # terminationMessagePolicy FallbackToLogsOnError: a failed container's message is its log's end.
        tail = None if code == 0 else self.log_tail(key)
        self.report(pod, "Succeeded" if code == 0 else "Failed", exit_code=code, started=started, message=tail)

    def log_tail(self, key: tuple[str, str], limit: int = 2048) -> str | None:
        """The end of a container's log, as much as the kubelet would fall back to."""
        path = self.log_dir / f"{key[0]}_{key[1]}.log"
        try:
            data = path.read_bytes()[-limit:]
        except OSError:
            return None
        return data.decode(errors="replace") or None

    def shm(self, key: tuple[str, str]) -> Path:
        return self.log_dir / "work" / key[0] / key[1] / "dev-shm"

    def kill(self, key: tuple[str, str]) -> None:
        with self.lock:
            running = self.running.pop(key, None)
        if running is None:
            return
        try:
            self._end(running)
        finally:
            shutil.rmtree(self.shm(key), ignore_errors=True)

    def _end(self, running: Running) -> None:
        for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, None)):
            try:
                os.killpg(running.process.pid, sig)
            except ProcessLookupError:  # it ended on its own meanwhile
                pass
            try:
                running.process.wait(grace)
                return
            except subprocess.TimeoutExpired:
                continue

    def remove(self, pod: client.V1Pod) -> None:
        try:
            self.core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0)
        except ApiException as error:
            if error.status != 404:
                raise

    def report(self, pod: client.V1Pod, phase: str, exit_code: int | None = None, started: str | None = None,
               reason: str | None = None, message: str | None = None) -> None:
        container = pod.spec.containers[0]
        code = None if phase == "Running" else (1 if exit_code is None else exit_code)
        status = pod_status(container.name, container.image, code, reason, started, message=message)
        status.update(hostIP="127.0.0.1", podIP="127.0.0.1")
        # The uid is a precondition: a late report about a process of a deleted pod must not land
        # on its successor of the same name (the next gang attempt).
        body = {"metadata": {"uid": pod.metadata.uid}, "status": status}
        try:
            self.core.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace, body)
        except ApiException as error:
            if error.status not in (404, 409, 422):  # gone, or replaced (uid mismatch)
                log.warning("status of %s failed: %s", pod.metadata.name, error.reason)

    def shutdown(self) -> None:
        self.stop.set()
        for key in list(self.running):
            self.kill(key)
        self.unregister()


def _mounted(arg: str, mounts: dict[str, Path]) -> str:
    """An argument naming a file under a mounted path, pointed at the local copy."""
    for path, local in mounts.items():
        if arg == path or arg.startswith(path + "/"):
            return str(local) + arg[len(path):]
    return arg


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    parser.add_argument("--log-dir", type=Path, required=True)
    parser.add_argument("--node", default=NODE, help="the node's name: a runner of its own when several share a "
                        "control plane (pods then select it by kubernetes.io/hostname as well)")
    parser.add_argument("--pods", type=int, default=64, help="how many pods the node holds (its pods capacity)")
    parser.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="a label for the node")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s podrunner %(message)s")
    args.log_dir.mkdir(parents=True, exist_ok=True)
    labels = dict(item.split("=", 1) for item in args.label)
    runner = PodRunner(kubeclient.api_client(args.kubeconfig), args.log_dir, args.node, args.pods, labels)
    runner.register()
    signal.signal(signal.SIGTERM, lambda *_: runner.stop.set())
    signal.signal(signal.SIGINT, lambda *_: runner.stop.set())
    threading.Thread(target=runner.heartbeats, daemon=True).start()
    watcher = threading.Thread(target=runner.watch_pods, daemon=True)
    watcher.start()
    log.info("node %s registered on %s", runner.node, socket.gethostname())
    runner.stop.wait()
    runner.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
