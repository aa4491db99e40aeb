"""Processes of the local control plane as the kernel sees them: alive, and where they listen."""

from __future__ import annotations

import os
import socket
from pathlib import Path


def listening_addresses(pids: list[int]) -> list[str]:
    """The local addresses (hex ip:port as in /proc/net/{tcp,udp}*) on which these processes listen
    (TCP) or take datagrams (UDP)."""
    inodes: set[str] = set()
    for pid in pids:
        fd_dir = Path(f"/proc/{pid}/fd")
        for fd in fd_dir.iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    # 0A: a listening TCP socket; 07: an unconnected UDP one (a server's)
    for table, state in (("tcp", "0A"), ("tcp6", "0A"), ("udp", "07"), ("udp6", "07")):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == state and fields[9] in inodes:
                found.append(fields[1])
    return found


def ip_of(hex_address: str) -> str:
    ip_hex = hex_address.split(":")[0]
    if len(ip_hex) == 8:
        return socket.inet_ntoa(bytes.fromhex(ip_hex)[::-1])
    return "::1" if ip_hex == "00000000000000000000000001000000" else ip_hex


def is_loopback(hex_address: str) -> bool:
    return ip_of(hex_address).startswith("127.") or ip_of(hex_address) == "::1"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def rank_pid(namespace: str, job: str, rank: int, supervised: bool = False) -> int | None:
    """The process of this machine running `rank` of the job, found by its environment: a pod runner's
    rank, or a rank in a container on the real node (the host sees its processes). supervised: the
    rank process an InPlace pod's runtime started (DDP_SUPERVISED), not that runtime; or, from the
    attempt after a gang formed, the child of the pod's zygote (whose environ it shows)."""
    wanted = {f"DDP_JOB_NAMESPACE={namespace}", f"DDP_JOB_NAME={job}", f"RANK={rank}"}
    found = _with_environ(wanted | ({"DDP_SUPERVISED=1"} if supervised else set()))
    if found or not supervised:
        return found[0] if found else None
    marked = set(_with_environ(wanted | {"DDP_ZYGOTE=1"}))
    zygotes = {pid for pid in marked if parent_of(pid) not in marked}  # its children show its environ too
    children = [pid for pid in _pids() if parent_of(pid) in zygotes]
    return children[0] if children else None


def _pids() -> list[int]:
    return [int(proc.name) for proc in Path("/proc").iterdir() if proc.name.isdigit()]


def command_pids(namespace: str, job: str, rank: int) -> list[int]:
    """The processes of a job's command in rank `rank`'s container, seen from this machine: the runtime
    sets DDP_FAILURE_DIR on them (ddp_trainer.runtime.command), not on itself."""
    return _with_environ({f"DDP_JOB_NAMESPACE={namespace}", f"DDP_JOB_NAME={job}", f"RANK={rank}"},
                         names=("DDP_FAILURE_DIR",))


def _with_environ(wanted: set[str], names: tuple[str, ...] = ()) -> list[int]:
    """Processes whose environment holds every NAME=value of `wanted` and each of `names`, whatever its value."""
    found = []
    for pid in _pids():
        try:
            environ = set(Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0"))
        except OSError:
            continue
        if wanted <= environ and all(any(item.startswith(f"{name}=") for item in environ) for name in names):
            found.append(pid)
    return found


def parent_of(pid: int) -> int | None:
    """The pid's parent, None once it has gone."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None
