"""A real S3 server for `make demo`, the tests and the benchmarks: SeaweedFS (`weed server` with its
master, volume server, filer and S3 gateway in one process), built once from its Go module
(localcluster/go/seaweedfs) into $DDP_CACHE/bin/seaweedfs-<version>/weed.

Each server runs in a folder of its own, listens on one address only (loopback, or the node's bridge
gateway for pods), checks request signatures against the demo's access key, stops when the process
that started it dies (PR_SET_PDEATHSIG) or the context ends, and leaves nothing behind.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEAWEEDFS_VERSION = "v0.0.0-20261109003541-7506e5f91cd6"  # must match go/seaweedfs/go.mod
SEAWEEDFS_MODULE = "github.com/seaweedfs/seaweedfs"
CACHE = Path(os.environ.get("DDP_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
             / "ddp-operator")
BIN = CACHE / "bin" / f"seaweedfs-{SEAWEEDFS_VERSION}"
START_SECONDS = 120.0
STOP_SECONDS = 3.0  # SIGTERM to SIGKILL: its data goes with its folder, nothing to shut down cleanly for
# One volume per bucket (SeaweedFS grows 7 for each new collection by default), of at most 64 MB: the
# tests make hundreds of buckets on one small disk.
MASTER_TOML = """[master.volume_growth]
copy_1 = 1
"""


class S3ServerError(RuntimeError):
    """The server could not be built or did not start; the message says why, with its log's end."""


def weed() -> Path:
    """The `weed` binary, built from the pinned module on first use (one build at a time)."""
    binary = BIN / "weed"
    if binary.exists():
        return binary
    if shutil.which("go") is None:
        raise S3ServerError("go is not installed: the S3 server (SeaweedFS) is built from its Go module")
    BIN.parent.mkdir(parents=True, exist_ok=True)
    with open(BIN.parent / f".seaweedfs-{SEAWEEDFS_VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if binary.exists():  # another process built it while this one waited
            return binary
        partial = BIN.with_name(f"{BIN.name}.tmp.{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        # GOGC and GOMEMLIMIT as gocache.sh's go_compiler_memory sets them for the other builds.
        env = {"GOGC": "400", "GOMEMLIMIT": "3GiB", **os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod",
               "CGO_ENABLED": "0"}
        # A build cache of its own, removed afterwards, unless GOCACHE is set (as gocache.sh does).
        scoped_cache = None if "GOCACHE" in env else BIN.parent.parent / f"go-build.{os.getpid()}"
        if scoped_cache is not None:
            env["GOCACHE"] = str(scoped_cache)
        print(f"[s3server] building SeaweedFS {SEAWEEDFS_VERSION} (once; cached in {BIN})", flush=True)
        try:
            result = subprocess.run(["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(partial / "weed"),
                                     f"{SEAWEEDFS_MODULE}/weed"], cwd=HERE / "go" / "seaweedfs", env=env,
                                    capture_output=True, text=True)
        finally:
            if scoped_cache is not None:
                shutil.rmtree(scoped_cache, ignore_errors=True)
        if result.returncode != 0:
            shutil.rmtree(partial, ignore_errors=True)
            raise S3ServerError(f"building SeaweedFS failed:\n{result.stderr[-3000:]}")
        partial.rename(BIN)
    return binary


def make_certificate(folder: Path, host: str) -> tuple[Path, Path, Path]:
    """A CA of its own and a server certificate for the IP address `host`, signed by it, made with
    openssl in `folder`: (certificate, key, CA certificate)."""
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    openssl("req", "-x509", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
            "-subj", "/CN=ddp-operator test S3 CA")
    openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", "tls.key", "-out", "tls.csr", "-subj", f"/CN={host}")
    (folder / "tls.ext").write_text(f"subjectAltName=IP:{host}\nextendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
            "-out", "tls.crt", "-extfile", "tls.ext")
    return folder / "tls.crt", folder / "tls.key", folder / "ca.crt"


def free_ports(host: str, count: int) -> list[int]:
    """`count` distinct ports free on `host` now (held open together while chosen)."""
    with ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in sockets]


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


NO_LIST = "-no-list"  # the access key's suffix of the identity that may read and write but not list


def s3_config(access_key: str, secret_key: str) -> dict[str, object]:
    """SeaweedFS's identities file: an admin identity with the given key pair, and one (the access key
    with NO_LIST after it) that may read and write objects but not list them, as a bucket policy
    without s3:ListBucket allows."""
    return {"identities": [
        {"name": "ddp", "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
         "actions": ["Admin", "Read", "List", "Tagging", "Write"]},
        {"name": "ddp-no-list", "credentials": [{"accessKey": access_key + NO_LIST, "secretKey": secret_key}],
         "actions": ["Read", "Write"]}]}


@contextmanager
def seaweedfs(access_key: str, secret_key: str, host: str = "127.0.0.1", port: int = 0,
              tls: tuple[Path, Path, Path] | None = None) -> Iterator[str]:
    """A SeaweedFS S3 server on `host`:`port` (0: a free port); yields its endpoint once it takes writes.
    `tls` (certificate, key, the CA that signed it): it serves https with that certificate."""
    binary = weed()
    folder = Path(tempfile.mkdtemp(prefix="ddp-s3-"))
    proc: subprocess.Popen[bytes] | None = None
    grpc_ports: dict[str, int] = {}
    try:
        (folder / "data").mkdir()
        (folder / "s3.json").write_text(json.dumps(s3_config(access_key, secret_key)))
        (folder / "master.toml").write_text(MASTER_TOML)
        master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3_grpc, chosen = free_ports(host, 8)
        grpc_ports.update(master=master_grpc, volume=volume_grpc, filer=filer_grpc, s3=s3_grpc)
        port = port or chosen
        args = [str(binary), "server", f"-dir={folder / 'data'}", f"-ip={host}", f"-ip.bind={host}",
                f"-master.port={master}", f"-master.port.grpc={master_grpc}", "-master.volumeSizeLimitMB=64",
                "-master.telemetry=false", f"-volume.port={volume}", f"-volume.port.grpc={volume_grpc}",
                "-volume.max=0", "-volume.preStopSeconds=0", "-filer", f"-filer.port={filer}",
                f"-filer.port.grpc={filer_grpc}", f"-filer.localSocket={folder / 'filer.sock'}",
                "-s3", f"-s3.port={port}", f"-s3.port.grpc={s3_grpc}", f"-s3.config={folder / 's3.json'}",
                "-s3.port.iceberg=0", "-s3.port.lance=0", f"-s3.localSocket={folder / 's3.sock'}",
                "-s3.allowDeleteBucketNotEmpty=true", "-s3.autoCreateBucket=false",  # as AWS: NoSuchBucket
                *([f"-s3.cert.file={tls[0]}", f"-s3.key.file={tls[1]}"] if tls else [])]
        with open(folder / "weed.log", "wb") as log:
            proc = subprocess.Popen(args, cwd=folder, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    preexec_fn=_die_with_parent)
        endpoint = f"{'https' if tls else 'http'}://{host}:{port}"
        _wait_until_writable(endpoint, access_key, secret_key, proc, folder / "weed.log", str(tls[2]) if tls else None)
        yield endpoint
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(folder, ignore_errors=True)
        for name, grpc_port in grpc_ports.items():  # `weed server` puts these in /tmp whatever its folder
            Path(f"/tmp/seaweedfs-{name}-grpc-{grpc_port}.sock").unlink(missing_ok=True)


def _wait_until_writable(endpoint: str, access_key: str, secret_key: str, proc: subprocess.Popen[bytes],
                         log: Path, ca: str | None) -> None:
    """Until a bucket can be made, written, read and removed: the volume server has joined the master."""
    import boto3
    from botocore.config import Config

    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=access_key, aws_secret_access_key=secret_key,
                          region_name="us-east-1", verify=ca, config=Config(retries={"max_attempts": 1},
                                                                            connect_timeout=2, read_timeout=10))
    probe = f"ddp-ready-{uuid.uuid4().hex[:8]}"
    deadline = time.monotonic() + START_SECONDS
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise S3ServerError(f"SeaweedFS exited with code {proc.returncode}:\n{_tail(log)}")
        try:
            client.create_bucket(Bucket=probe)
            client.put_object(Bucket=probe, Key="probe", Body=b"ready")
            if client.get_object(Bucket=probe, Key="probe")["Body"].read() == b"ready":
                client.delete_object(Bucket=probe, Key="probe")
                client.delete_bucket(Bucket=probe)
                return
        except Exception as error:  # noqa: BLE001 - not up yet: connection refused, no writable volume
            last = error
        time.sleep(0.2)
    raise S3ServerError(f"SeaweedFS at {endpoint} took no writes within {START_SECONDS:.0f} s ({last}):\n{_tail(log)}")


def _tail(log: Path, lines: int = 40) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["build"]:
        sys.exit("usage: s3server.py build   (builds SeaweedFS's weed once; the tests and the demo start it)")
    print(weed())
